// onnxtrain's output (train_report.h): plan, progress, epoch lines, metrics JSON.
#include "tools/train_report.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "graph/error.h"
#include "ops/nn/blocked_layout.h"
#include "train/checkpoint_state.h"

namespace onnxtrain::tools {
namespace {

// 101770 -> "101,770".
std::string grouped(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > (v < 0 ? 1 : 0); i -= 3) s.insert(i, ",");
  return s;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Keras' per-step time: "1.34s/step" from a second up, "12ms/step" below.
std::string per_step(double seconds) {
  return seconds >= 1 ? fmt("%.2fs/step", seconds) : fmt("%.0fms/step", seconds * 1e3);
}

std::string mib(int64_t bytes) {
  return fmt("%.3g MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

std::string json_number(std::optional<double> v) {
  if (!v || !std::isfinite(*v)) return "null";
  return fmt("%.9g", *v);
}

}  // namespace

std::string bytes_text(int64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt("%.3g GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt("%.3g MiB", b / (1024.0 * 1024));
  return fmt("%.3g KiB", b / 1024.0);
}

double ring_allreduce_seconds(int64_t bytes, int n, double gbit_per_s) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * static_cast<double>(bytes) * 8 / (gbit_per_s * 1e9);
}

void print_plan(const TrainConfig& c, const PlanFacts& p) {
  std::FILE* f = c.log;
  const train::Options& o = c.train;
  const TrainResult& r = p.result;
  const int all = o.parallel.replicas * p.processes;
  std::string devices;
  for (int k = 0; k < o.parallel.replicas; ++k)
    devices += (k ? ", cpu:" : "cpu:") + std::to_string(k);
  std::string per_replica = std::to_string(r.global_batch / all);
  if (r.global_batch % all != 0) per_replica += "-" + std::to_string(r.global_batch / all + 1);
  std::fprintf(f, "model       %s (input%s %s, output '%s'%s)\n", p.model_path.c_str(),
               p.inputs.find(", ") != std::string::npos ? "s" : "", p.inputs.c_str(),
               p.output_name.c_str(), p.classes > 0 ? cat(", ", p.classes, " classes").c_str() : "");
  if (p.untie) {
    for (const std::string& w : p.untie->tied) std::fprintf(f, "warning     %s\n", w.c_str());
    const size_t copies = p.untie->copied.size();
    if (copies > 0 && copies <= 4)
      for (const std::string& line : p.untie->copied) std::fprintf(f, "untied      %s\n", line.c_str());
    else if (copies > 4)
      std::fprintf(f, "untied      %zu shared initializers copied per consumer, e.g. %s\n", copies,
                   p.untie->copied.front().c_str());
  }
  if (p.processes > 1)
    std::fprintf(f, "replicas    %d = %d processes (MPI) x %d (%s each)\n", all, p.processes,
                 o.parallel.replicas, devices.c_str());
  else
    std::fprintf(f, "replicas    %d (%s)\n", o.parallel.replicas, devices.c_str());
  std::fprintf(f, "batch       %s per replica, %lld global\n", per_replica.c_str(),
               static_cast<long long>(r.global_batch));
  std::fprintf(f, "data        %s: %lld examples%s%s\n", p.train_name.c_str(),
               static_cast<long long>(p.train_examples), p.adapter.empty() ? "" : ", ",
               p.adapter.c_str());
  std::fprintf(f, "steps       %lld steps per epoch, %lld epoch%s, %lld steps%s\n",
               static_cast<long long>(r.steps_per_epoch), static_cast<long long>(p.epochs),
               p.epochs == 1 ? "" : "s", static_cast<long long>(r.total_steps),
               r.start_step > 0 ? cat(" (resuming after step ", r.start_step, ")").c_str() : "");
  std::fprintf(f, "parameters  %s trainable in %zu tensors\n",
               grouped(r.trainable_parameters).c_str(), p.info.prepared.params.size());
  if (const std::vector<std::string>& b = p.info.prepared.buffers; !b.empty())
    std::fprintf(
        f, "buffers     %s fixed, as in torch: %s%s\n",
        b.size() == 1
            ? "1 initializer the exporter marked as a module buffer stays"
            : cat(b.size(), " initializers the exporter marked as module buffers stay").c_str(),
        b.front().c_str(), b.size() > 1 ? ", ..." : "");
  std::fprintf(f, "optimizer   %s, lr %g, schedule %s\n",
               std::string(train::optimizer_kind_name(o.optimizer.kind)).c_str(),
               static_cast<double>(o.schedule.lr), o.schedule.lr_schedule.c_str());
  std::string loss_detail;  // cross-entropy over a sequence: where the classes are, the padding
  if (p.info.loss.kind == passes::LossKind::kCrossEntropy) {
    if (p.class_axis != 1) loss_detail += cat("classes on axis ", p.class_axis);
    if (o.model.ignore_index)
      loss_detail += cat(loss_detail.empty() ? "" : ", ", "labels ", *o.model.ignore_index, " ignored");
  }
  std::fprintf(f, "loss        %s on '%s'%s\n",
               std::string(train::loss_kind_name(p.info.loss.kind)).c_str(), p.output_name.c_str(),
               loss_detail.empty() ? "" : cat(" (", loss_detail, ")").c_str());
  if (p.info.autocast.low_nodes > 0) {
    std::fprintf(f, "precision   %s mixed: %d Conv/Gemm/MatMul and %d following nodes (BN, Relu, "
                 "Add, Mul, pooling, reshapes) and their gradients in %s, %d casts; float32 master weights, optimizer, "
                 "normalization statistics and loss\n",
                 train::precision_name(o.model.precision).c_str(), p.info.autocast.low_nodes,
                 p.info.autocast.follow_nodes, train::precision_name(o.model.precision).c_str(),
                 p.info.autocast.casts);
    if (o.model.precision == graph::DataType::kFloat16)
      std::fprintf(f, "loss scale  dynamic, from %g: a step whose gradients overflow float16 is "
                   "skipped and halves it; %lld clean steps double it\n",
                   o.model.loss_scaler.init,
                   static_cast<long long>(o.model.loss_scaler.growth_interval));
  } else if (o.model.precision != graph::DataType::kFloat)
    std::fprintf(f, "precision   %s requested, but no float32 Conv/Gemm/MatMul to run in it: "
                 "float32 throughout\n", train::precision_name(o.model.precision).c_str());
  if (o.model.conv_algorithm == passes::ConvAlgorithm::kWinograd) {
    const passes::ConvAlgorithmStats& c = p.info.conv_algorithm;
    std::fprintf(f, "convolution winograd on %d of %d convolutions and %d of %d gradients (3x3 "
                 "stride 1 float32, maps >= 7x7; the rest direct)\n",
                 c.winograd_forward, c.forward, c.winograd_backward, c.backward);
  }
  if (p.info.batchnorm_relu.fused > 0)
    std::fprintf(f, "fused       Relu into %d of %d BatchNormalization nodes (%d with the "
                 "residual Add before it) and %d of their gradients\n",
                 p.info.batchnorm_relu.fused, p.info.batchnorm_relu.batchnorms,
                 p.info.batchnorm_relu.fused_residual, p.info.batchnorm_relu.fused_grads);
  if (p.info.batchnorm_relu.fused_sums > 0)
    std::fprintf(f, "fused       Sum into %d ReluGrad nodes (the residual stream's gradient)\n",
                 p.info.batchnorm_relu.fused_sums);
  if (p.info.transposes.matmul_operands + p.info.transposes.gemm_outputs > 0)
    std::fprintf(f, "fused       %d Transposes into the MatMuls reading them and %d into the "
                 "Gemms they transposed (operands read strided, results written transposed)\n",
                 p.info.transposes.matmul_operands, p.info.transposes.gemm_outputs);
  if (p.info.lstm_traces > 0)
    std::fprintf(f,
                 "recurrent   the gates and states of %d LSTM%s kept for the gradient (not "
                 "recomputed)\n",
                 p.info.lstm_traces, p.info.lstm_traces == 1 ? "" : "s");
  if (p.info.weight_copies.copies > 0)
    std::fprintf(f, "weights     %d convolution weights (%s elements) kept as bf16 copies, "
                 "rewritten after each update; float32 masters\n",
                 p.info.weight_copies.copies, grouped(p.info.weight_copies.elements).c_str());
  if (p.info.weight_copies.bf16_gradients > 0)
    std::fprintf(f, "gradients   %d updates read their bf16 gradient directly (widened as read, "
                 "no float32 copy of it)\n",
                 p.info.weight_copies.bf16_gradients);
  if (p.info.schedule.interleaved > 0)
    std::fprintf(f, "updates     %d of %d optimizer nodes run during the backward, each as soon "
                 "as its gradient is ready (its buffer then serves the rest of the backward)\n",
                 p.info.schedule.interleaved, p.info.schedule.update_nodes);
  if (p.info.block_layout.blocked_values > 0)
    std::fprintf(f, "layout      nChw%lldc blocked: %d activations between convolutions, read "
                 "without reorders by %d Conv/ConvGrad and %d BatchNormalization(Grad) nodes\n",
                 static_cast<long long>(ops::channel_block()), p.info.block_layout.blocked_values,
                 p.info.block_layout.convolutions, p.info.block_layout.batchnorms);
  std::fprintf(f, "device      %s\n", p.devices.c_str());
  std::fprintf(f, "threads     %d per replica\n", p.threads_per_replica);
  if (p.memory.total() > 0)
    std::fprintf(f, "memory      %s planned per replica: arena %s (activations, gradients; %s "
                 "without reuse), workspace %s, state %s (weights, optimizer, BN statistics)%s; "
                 "prepared in %.2fs\n",
                 bytes_text(p.memory.total()).c_str(), bytes_text(p.memory.arena_bytes).c_str(),
                 bytes_text(p.memory.unshared_bytes).c_str(),
                 bytes_text(p.memory.workspace_bytes).c_str(),
                 bytes_text(p.memory.state_bytes).c_str(),
                 p.memory.persistent_scratch_bytes > 0
                     ? cat(", buckets ", bytes_text(p.memory.persistent_scratch_bytes)).c_str()
                     : "",
                 p.prepare_seconds);
  // --reduce-precision bf16: the gradients travel at half their float32 bytes.
  const bool bf16_wire = o.parallel.reduce_precision == graph::DataType::kBFloat16;
  if (all > 1) {
    int64_t bytes = 0;
    for (int64_t b : p.info.buckets.bytes) bytes += b;
    std::fprintf(f, "allreduce   %zu bucket%s, %s of gradients per replica (--bucket-mb %g)%s\n",
                 p.info.buckets.num_buckets(), p.info.buckets.num_buckets() == 1 ? "" : "s",
                 mib(bytes).c_str(), o.parallel.bucket_mb,
                 bf16_wire ? cat("; reduced in bf16: ", mib(bytes / 2), " on the wire").c_str() : "");
    const passes::ShardInfo& sh = p.info.sharded;
    if (sh.params > 0) {
      std::string split;
      for (int64_t b : sh.bytes) split += cat(split.empty() ? "" : " / ", mib(b));
      std::fprintf(f,
                   "sharded     updates of %d of %d parameters each on one replica, then broadcast "
                   "(%s of weights per replica; %s less optimizer state; --no-shard-updates)\n",
                   sh.params, sh.candidates, split.c_str(), mib(sh.state_bytes_dropped).c_str());
    }
    if (o.parallel.sync_batchnorm)
      std::fprintf(f, "batchnorm   statistics over the global batch (--sync-batchnorm)\n");
  }
  // What the network between machines must carry (README "Several machines"): replicas of one
  // process sum in memory first, so the ring spans the processes.
  const int n = std::max(p.processes, 2);
  std::fprintf(f, "network     %s bytes AllReduced per step (%s%s); ring 2(n-1)/n x bytes over n = %d "
               "processes%s: %.3g ms at 10 Gbit/s, %.3g ms at 100 Gbit/s\n",
               grouped(p.allreduce_bytes).c_str(), mib(p.allreduce_bytes).c_str(),
               bf16_wire ? cat("; bf16, ", grouped(2 * p.allreduce_bytes), " in float32").c_str()
                         : "",
               n,
               p.processes > 1 ? "" : " (if run on 2)",
               1e3 * ring_allreduce_seconds(p.allreduce_bytes, n, 10),
               1e3 * ring_allreduce_seconds(p.allreduce_bytes, n, 100));
  if (p.val_name.empty())
    std::fprintf(f, "validation  none\n");
  else
    std::fprintf(f, "validation  %s: %lld examples\n", p.val_name.c_str(),
                 static_cast<long long>(p.val_examples));
  std::fflush(f);
}

std::string epoch_line(const EpochMetrics& m, int64_t epochs, int64_t steps_per_epoch) {
  const double sec = m.seconds > 0 ? m.seconds : 1e-9;
  std::string s =
      cat("Epoch ", m.epoch, "/", epochs, "  ", m.steps, "/", steps_per_epoch, "  ",
          fmt("%.1fs", m.seconds), "  ",
          per_step(m.seconds / static_cast<double>(std::max<int64_t>(m.steps, 1))), "  ",
          fmt("%.0f ", static_cast<double>(m.examples) / sec) + m.rate_unit, "  loss ", fmt("%.4f", m.loss));
  if (m.accuracy) s += "  accuracy " + fmt("%.4f", *m.accuracy);
  if (m.val_loss) s += "  val_loss " + fmt("%.4f", *m.val_loss);
  if (m.val_accuracy) s += "  val_accuracy " + fmt("%.4f", *m.val_accuracy);
  if (m.skipped > 0) s += cat("  skipped ", m.skipped, " non-finite");
  if (m.loss_scale > 0)
    s += cat("  loss_scale ", fmt("%g", m.loss_scale),
             m.overflowed > 0 ? cat(" (", m.overflowed, " overflowed steps skipped)") : "");
  return s;
}

std::string metrics_json(const EpochMetrics& m) {
  const double ips = m.seconds > 0 ? static_cast<double>(m.examples) / m.seconds : 0;
  std::optional<double> steady_ips, steady_step;  // null without a step after the run's first
  if (m.steady_steps > 0 && m.steady_seconds > 0) {
    steady_ips = static_cast<double>(m.steady_examples) / m.steady_seconds;
    steady_step = m.steady_seconds / static_cast<double>(m.steady_steps);
  }
  return cat("{\"epoch\": ", m.epoch, ", \"steps\": ", m.steps,
             ", \"seconds\": ", json_number(m.seconds), ", \"images_per_sec\": ", json_number(ips),
             ", \"steady_images_per_sec\": ", json_number(steady_ips),
             ", \"steady_step_seconds\": ", json_number(steady_step),
             ", \"first_step_seconds\": ", json_number(m.first_step_seconds),
             ", \"max_rss_mib\": ",
             json_number(m.max_rss_bytes > 0
                             ? std::optional<double>(static_cast<double>(m.max_rss_bytes) / 1048576.0)
                             : std::nullopt),
             ", \"loss\": ", json_number(m.loss), ", \"accuracy\": ", json_number(m.accuracy),
             ", \"val_loss\": ", json_number(m.val_loss),
             ", \"val_accuracy\": ", json_number(m.val_accuracy),
             ", \"skipped_nonfinite\": ", m.skipped,
             ", \"loss_scale\": ", json_number(m.loss_scale > 0 ? std::optional<double>(m.loss_scale)
                                                              : std::nullopt),
             ", \"skipped_overflow\": ", m.overflowed, "}");
}

void write_metrics_line(std::FILE* f, const EpochMetrics& m) {
  const std::string line = metrics_json(m) + "\n";
  OT_CHECK(std::fputs(line.c_str(), f) >= 0 && std::fflush(f) == 0, "--metrics-json: write failed");
}

void Progress::step(int64_t epoch, int64_t step_in_epoch, double seconds, double loss,
                    std::optional<double> accuracy) {
  if (!live_) return;
  // Redraw at most ten times a second (and always on the epoch's last step).
  if (step_in_epoch != steps_per_epoch_ && last_draw_ >= 0 && seconds - last_draw_ < 0.1) return;
  last_draw_ = seconds;
  constexpr int kWidth = 24;
  const int done = static_cast<int>(kWidth * step_in_epoch / steps_per_epoch_);
  std::string bar(static_cast<size_t>(done), '=');
  if (done < kWidth) bar += '>' + std::string(static_cast<size_t>(kWidth - done - 1), '.');
  const double eta = seconds / static_cast<double>(step_in_epoch) *
                     static_cast<double>(steps_per_epoch_ - step_in_epoch);
  std::string line =
      cat("\r\033[KEpoch ", epoch, "/", epochs_, "  ", step_in_epoch, "/", steps_per_epoch_, " [",
          bar, "]  ETA ", fmt("%.0fs", eta), "  loss ", fmt("%.4f", loss));
  if (accuracy) line += "  accuracy " + fmt("%.4f", *accuracy);
  std::fputs(line.c_str(), log_);
  std::fflush(log_);
}

void Progress::epoch_done(const EpochMetrics& m) {
  last_draw_ = -1;
  std::fprintf(log_, "%s%s\n", live_ ? "\r\033[K" : "",
               epoch_line(m, epochs_, steps_per_epoch_).c_str());
  std::fflush(log_);
}

}  // namespace onnxtrain::tools
