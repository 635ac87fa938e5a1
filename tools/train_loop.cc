// run_training (train_loop.h): checks the files and options, builds a train::Trainer, then steps
// it through the loader, validating, reporting and checkpointing per epoch.
#include "tools/train_loop.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <regex>
#include <thread>

#include "graph/error.h"
#include "graph/file_io.h"
#include "graph/onnx_io.h"
#include "runtime/checkpoint.h"
#include "runtime/data/loader.h"
#include "runtime/finite.h"
#include "runtime/lr_schedule.h"
#include "tools/tensorboard.h"
#include "tools/train_report.h"
#include "train/trainer.h"

namespace onnxtrain::tools {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using FilePtr = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

int close_file(std::FILE* f) {
  return f ? std::fclose(f) : 0;
}

// The files a data spec reads (npy:, npz:, npy:NAME=FILE; folders and built-ins: none).
std::vector<std::string> data_files(const std::string& spec_text) {
  if (spec_text.empty() || spec_text == "none") return {};
  const runtime::DataSpec spec = runtime::parse_data_spec(spec_text);
  std::vector<std::string> files{spec.x_path, spec.y_path, spec.path};
  for (const auto& [name, file] : spec.files) files.push_back(file);
  return files;
}

// Before anything runs (issue #17): no output is an input or another output, every output can
// be written where it goes, and none lands where checkpoints are pruned.
void check_files(const TrainConfig& c) {
  const train::Options& o = c.train;
  std::vector<graph::FileRole> inputs{{"the input model", o.model.path}};
  for (const std::string& lib : o.model.custom_op_libs) inputs.push_back({"--custom-op-lib", lib});
  for (const std::string& f : data_files(o.data.train)) inputs.push_back({"--data", f});
  for (const std::string& f : data_files(o.data.val)) inputs.push_back({"--val-data", f});
  const std::vector<graph::FileRole> outputs{{"--output", c.output},
                                             {"--save-graph", c.save_graph},
                                             {"--metrics-json", c.metrics_json},
                                             {"--profile", o.parallel.profile}};
  graph::check_distinct_files(inputs, outputs);
  for (const graph::FileRole& out : outputs) {
    graph::check_writable(out);
    if (out.path.empty() || o.checkpoint.dir.empty()) continue;
    std::error_code ec;
    const bool in_dir = fs::equivalent(fs::absolute(out.path).parent_path(), o.checkpoint.dir, ec);
    const std::string name = fs::path(out.path).filename().string();
    OT_CHECK(!in_dir || !std::regex_match(name, std::regex("ckpt-[0-9]+\\.otck")), out.what, " '",
             out.path, "' is named like a checkpoint in --checkpoint-dir, where old checkpoints "
             "are deleted; choose another name");
  }
}

void check_config(const TrainConfig& c) {
  const train::Options& o = c.train;
  OT_CHECK(o.parallel.replicas >= 1, "--replicas must be >= 1, got ", o.parallel.replicas);
  // Every replica is at least one thread: far more of them than CPUs only queue (and setup and
  // memory grow with them), which is almost always a typo.
  constexpr int kMaxOversubscription = 8;
  const int cpus = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int wanted = std::max(o.parallel.replicas, o.parallel.threads) * o.parallel.local_processes;
  OT_CHECK(o.parallel.oversubscribe || wanted <= kMaxOversubscription * cpus, "--replicas ",
           o.parallel.replicas, " / --threads ", o.parallel.threads, " need ", wanted,
           " threads on this machine's ", cpus, " CPUs (more than ", kMaxOversubscription,
           " per CPU); give --oversubscribe if that is what you want");
  OT_CHECK(!o.checkpoint.resume || !o.checkpoint.dir.empty(), "--resume needs --checkpoint-dir");
  OT_CHECK(o.schedule.epochs >= 1 && o.schedule.steps >= 0,
           "--epochs must be >= 1 and --steps >= 0");
  OT_CHECK(o.data.batch_size >= 1 && o.data.global_batch >= 0, "batch sizes must be >= 1");
  OT_CHECK(o.checkpoint.every >= 0, "--checkpoint-every must be >= 0");
}

// ---- signals: the first one asks the loop to stop after its step, a second one ends at once.
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0) ::_exit(128 + sig);
  g_stop_signal = sig;
}

// Installs on_stop_signal for SIGINT, SIGTERM and SIGHUP while the loop runs; restores the
// previous handlers after it.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~StopSignals() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal to stop for, agreed by every process (the first one any process got).
  static int agreed(runtime::ProcessWorld* world) {
    int sig = g_stop_signal;
    if (world && world->size() > 1) {
      double v[2] = {static_cast<double>(sig), sig != 0 ? 1.0 : 0.0};
      world->all_reduce(v, 2, graph::DataType::kDouble, "stop signal");
      if (v[1] > 0 && sig == 0) sig = SIGTERM;  // another process got one
    }
    return sig;
  }

 private:
  static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> old_{};
};

const char* signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

// What a diagnosis (Trainer::diagnose_nonfinite) that finds every forward value finite means.
constexpr const char* kNoneInForward =
    "none in the forward pass (the loss's sum over the batch or the backward pass overflowed)";

// "; the newest checkpoint is DIR/ckpt-N.otck (...)" and what happened to --output, for the
// message that ends a run at a non-finite step.
std::string newest_checkpoint_text(const std::string& dir, const TrainConfig& c) {
  std::string out;
  if (!dir.empty()) {
    const std::vector<runtime::CheckpointFile> files = runtime::list_checkpoints(dir);
    out = files.empty() ? cat("; no checkpoint was written to '", dir, "'")
                        : cat("; the newest checkpoint is ", files.back().path,
                              " (continue from it with --resume, e.g. with a lower --lr)");
  }
  if (!c.output.empty()) out += cat("; --output '", c.output, "' was not written");
  return out;
}

// Running sums of the epoch in progress (checkpointed, so a resumed epoch reports the same).
EpochMetrics epoch_metrics(const train::RunPosition& p, int64_t epoch, bool ce,
                           const char* rate_unit) {
  EpochMetrics m;
  m.epoch = epoch;
  m.rate_unit = rate_unit;
  m.steps = p.epoch_steps;
  m.examples = p.epoch_examples;
  m.seconds = p.epoch_seconds;
  const double targets = static_cast<double>(std::max<int64_t>(p.epoch_targets, 1));
  m.loss = p.epoch_loss_sum / targets;
  if (ce) m.accuracy = p.epoch_correct / targets;
  return m;
}

// The process's peak resident memory so far, bytes; 0 unknown. /proc/self/status's VmHWM is
// this program's own high-water mark. getrusage's ru_maxrss is not: Linux carries the parent's
// peak across fork+exec, so a run started from a Python process holding 2 GiB reported a 2 GiB
// peak (found on the model corpus, whose harness has torch loaded). ru_maxrss (KiB) stays the
// fallback where /proc is not mounted.
int64_t max_rss_bytes() {
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long long kib = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
    std::fclose(f);
    if (kib >= 0) return static_cast<int64_t>(kib) * 1024;
  }
  struct rusage ru {};
  return ::getrusage(RUSAGE_SELF, &ru) == 0 ? static_cast<int64_t>(ru.ru_maxrss) * 1024 : 0;
}

// The process's resident memory now, bytes (/proc/self/statm counts pages); 0 unknown.
int64_t rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long pages = 0, resident = 0;
  const bool ok = std::fscanf(f, "%lld %lld", &pages, &resident) == 2;
  std::fclose(f);
  return ok ? static_cast<int64_t>(resident) * static_cast<int64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

// "+12.3 MiB" / "-4 MiB": a change of resident memory.
std::string delta_text(int64_t bytes) {
  return (bytes < 0 ? "-" : "+") + bytes_text(bytes < 0 ? -bytes : bytes);
}

}  // namespace

TrainResult run_training(const TrainConfig& config) {
  runtime::ProcessWorld* world = config.train.parallel.world;
  const bool lead = !world || world->size() <= 1 || world->rank() == 0;
  // The other processes compute the same and write nothing: no output, files or checkpoints.
  TrainConfig c = config;
  FilePtr quiet(nullptr, close_file);
  if (!lead) {
    quiet.reset(std::fopen("/dev/null", "w"));
    OT_CHECK(quiet, "cannot open /dev/null: ", std::strerror(errno));
    c.log = quiet.get();
    c.live = false;
    c.output.clear();
    c.save_graph.clear();
    c.metrics_json.clear();
    c.tensorboard.clear();
    if (!c.train.parallel.profile.empty()) c.train.parallel.profile += cat(".p", world->rank());
  }
  check_config(c);
  const train::Options& o = c.train;
  // Syntax of the data specs and the schedule first: a typo should not wait for the model.
  runtime::parse_data_spec(o.data.train);
  if (!o.data.val.empty() && o.data.val != "none") runtime::parse_data_spec(o.data.val);
  runtime::parse_lr_schedule(o.schedule.lr_schedule, o.schedule.lr);
  check_files(c);

  // Resident memory at each stage before step 1, so the peak can be told apart (issue #18).
  const int64_t rss_start = rss_bytes();
  train::Trainer trainer(o);
  if (!c.save_graph.empty()) graph::export_onnx_file(trainer.training_graph(), c.save_graph);
  const int64_t rss_model = rss_bytes();
  const train::TrainingData data = trainer.load_data();
  const int64_t rss_data = rss_bytes();
  const train::RunLength& len = trainer.plan_length(data.sets.train.size());
  const int64_t spe = len.steps_per_epoch;
  TrainResult res;
  res.global_batch = len.global_batch;
  res.steps_per_epoch = spe;
  res.total_steps = len.total_steps;
  res.trainable_parameters = trainer.trainable_parameters();
  trainer.check_setup(o.checkpoint.resume);

  // Files that must be writable before training starts.
  FilePtr metrics(nullptr, close_file);
  if (!c.metrics_json.empty()) {
    metrics.reset(std::fopen(c.metrics_json.c_str(), "a"));
    OT_CHECK(metrics, "--metrics-json '", c.metrics_json, "': ", std::strerror(errno));
  }
  // TensorBoard: the train file now, so a folder that cannot be written fails before step 1.
  std::unique_ptr<TensorBoardWriter> board;
  if (!c.tensorboard.empty()) {
    board = std::make_unique<TensorBoardWriter>(c.tensorboard);
    board->train();
  }
  // The event files are a by-product, as the metrics: a failed write warns once, training goes on.
  auto board_write = [&](const std::function<void(TensorBoardWriter&)>& fn) {
    if (!board) return;
    try {
      fn(*board);
    } catch (const Error& e) {
      std::fprintf(stderr, "onnxtrain: warning: %s; no more TensorBoard events are written\n",
                   e.what());
      board.reset();
    }
  };
  const bool checkpoints = !o.checkpoint.dir.empty();
  if (checkpoints && lead) {
    std::error_code ec;
    fs::create_directories(o.checkpoint.dir, ec);
    OT_CHECK(fs::is_directory(o.checkpoint.dir), "--checkpoint-dir '", o.checkpoint.dir,
             "': cannot create the folder", ec ? cat(": ", ec.message()) : "");
    // A fresh run never mixes its checkpoints into another run's (--resume continues that one).
    const std::vector<runtime::CheckpointFile> there = runtime::list_checkpoints(o.checkpoint.dir);
    OT_CHECK(o.checkpoint.resume || o.checkpoint.overwrite || there.empty(), "--checkpoint-dir '",
             o.checkpoint.dir, "' already holds ", there.size(), " checkpoint",
             there.size() == 1 ? "" : "s", " (newest ",
             there.empty() ? "" : fs::path(there.back().path).filename().string(),
             "): continue that run with --resume, use an empty folder, or give "
             "--overwrite-checkpoints (those files are then kept, never pruned)");
  }

  trainer.start();
  train::RunPosition pos;
  pos.steps_per_epoch = spe;
  if (o.checkpoint.resume) {
    pos = trainer.resume();
    res.start_step = std::min(pos.step, res.total_steps);
  }
  // Every process validates its share of the batches (Trainer::evaluate); rank 0 reports.
  const bool validate = data.sets.val.has_value();

  runtime::LoaderOptions tl;
  tl.batch_size = res.global_batch;
  tl.seed = o.data.seed;
  tl.images = trainer.image_stream(true);
  trainer.set_fill(tl);  // under MPI, decode only this process's rows
  runtime::DataLoader loader(data.sets.train, data.adapter, tl,
                             runtime::LoaderPosition{res.start_step / spe, res.start_step % spe});
  // The first batch is read now and every replica's plan built for its shape, so step 1 costs
  // what later steps do (issue #18) and the plan can say what the memory holds.
  std::optional<runtime::Batch> first;
  double prepare_seconds = 0;
  if (res.start_step < res.total_steps) {
    const auto t0 = Clock::now();
    first = loader.next();
    trainer.prepare(*first);
    prepare_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  const int64_t rss_prepared = rss_bytes();

  std::string inputs;
  const char* rate_unit = "samples/s";  // images: a float input of rank >= 3 past the batch
  for (const runtime::ModelInput& in : trainer.model_inputs()) {
    if (graph::is_float_dtype(in.dtype) && in.dims.size() >= 3) rate_unit = "img/s";
    inputs += cat(inputs.empty() ? "" : ", ", "'", in.name, "' [N");
    for (int64_t d : in.dims) inputs += d < 0 ? std::string(",?") : cat(",", d);
    inputs += cat("] ", graph::dtype_short_name(in.dtype));
  }
  // Image files: how they are decoded, then the adapter (normalization).
  std::string adapter_text = data.adapter.describe();
  if (data.sets.train.is_image_files())
    adapter_text = cat("decoded per batch by ", tl.images.workers, " worker",
                       tl.images.workers == 1 ? "" : "s", ", augment ",
                       runtime::augment_name(tl.images.augment),
                       adapter_text.empty() ? "" : ", ", adapter_text);
  const PlanFacts plan{.model_path = o.model.path,
                       .inputs = inputs,
                       .output_name = trainer.info().prepared.logits,
                       .classes = trainer.classes(),
                       .class_axis = trainer.options().model.class_axis,
                       .train_name = data.sets.train.name(),
                       .train_examples = data.sets.train.size(),
                       .val_name = data.sets.val ? data.sets.val->name() : "",
                       .val_examples = data.sets.val ? data.sets.val->size() : 0,
                       .adapter = adapter_text,
                       .info = trainer.info(),
                       .result = res,
                       .epochs = len.epochs,
                       .threads_per_replica = std::max(1, trainer.threads() / o.parallel.replicas),
                       .devices = trainer.devices_text(),
                       .processes = trainer.processes(),
                       .allreduce_bytes = trainer.allreduce_bytes(),
                       .untie = &trainer.untie_report(),
                       .memory = first ? trainer.memory_facts() : train::MemoryFacts{},
                       .prepare_seconds = prepare_seconds};
  print_plan(c, plan);
  const bool ce = trainer.cross_entropy();
  Progress progress(c, spe, len.epochs);
  const bool skip_nonfinite = o.guard.on_nonfinite == train::OnNonFinite::kSkip;
  std::map<std::string, graph::Tensor> before;  // skip: the state from before the step
  int64_t skipped = 0, skipped_in_row = 0;       // skipped steps: this epoch, in a row
  int64_t overflowed = 0, overflow_notes = 0;     // fp16 overflow skips: this epoch, noted
  int64_t bad_images = 0, bad_noted = 0;  // --on-bad-image skip: substituted rows, reported
  constexpr int64_t kOverflowNotes = 3;
  EpochMetrics steady;  // this epoch's run-first-step and steady-state figures
  StopSignals signals;
  for (int64_t s = res.start_step; s < res.total_steps; ++s) {
    const auto t0 = Clock::now();
    runtime::Batch b = s == res.start_step && first ? std::move(*first) : loader.next();
    const int64_t n = b.size(), targets = trainer.targets(b);
    bad_images += b.bad_images;
    runtime::Batch kept = b;  // for a diagnosis when the step turns out non-finite
    if (skip_nonfinite) before = trainer.state();
    const double scale_before = trainer.loss_scaler().scale;
    runtime::StepResult r = trainer.run_step(std::move(b), s);
    if (o.parallel.verify_ranks) trainer.check_weights_agree(cat("after step ", s + 1));
    // The loss is summed over every replica and process, so all of them decide alike.
    if (!r.finite) {
      // fp16: the graph skipped the update itself (no state changed); the scale halved.
      ++overflowed;
      if (++overflow_notes <= kOverflowNotes)
        std::fprintf(c.log, "%snote        step %lld: gradients overflowed float16 at loss scale "
                     "%g: step skipped, scale now %g%s\n", c.live ? "\r\033[K" : "",
                     static_cast<long long>(s + 1), scale_before, trainer.loss_scaler().scale,
                     overflow_notes == kOverflowNotes ? " (further skips: counted per epoch)" : "");
    } else if (!std::isfinite(r.loss)) {
      const std::string loss_text = runtime::nonfinite_text(r.loss);
      if (skip_nonfinite) {
        trainer.set_state(before);  // the update never happened
        const std::string bad = trainer.nonfinite_state();
        OT_CHECK(bad.empty(), "step ", s + 1, ": the loss is ", loss_text,
                 " and the state from before the step is not finite either: ", bad,
                 " (an earlier step's update made it so with a finite loss); stopping");
        ++skipped;
        ++skipped_in_row;
        const std::string why = lead ? trainer.diagnose_nonfinite(kept) : "";
        std::fprintf(c.log, "%swarning     step %lld: the loss is %s; its update is skipped "
                     "(--on-nonfinite skip, %lld in a row)%s\n", c.live ? "\r\033[K" : "",
                     static_cast<long long>(s + 1), loss_text.c_str(),
                     static_cast<long long>(skipped_in_row),
                     cat("; first non-finite value: ", why.empty() ? kNoneInForward : why).c_str());
        std::fflush(c.log);
        OT_CHECK(skipped_in_row < o.guard.max_skips, "step ", s + 1, ": ", skipped_in_row,
                 " steps in a row had a non-finite loss (--max-nonfinite-skips ",
                 o.guard.max_skips, "); stopping", newest_checkpoint_text(o.checkpoint.dir, c));
      } else {
        // Stop before anything is written: no checkpoint or model of this state exists.
        const std::string why = lead ? trainer.diagnose_nonfinite(kept) : "";
        fail("step ", s + 1, ": the loss is ", loss_text,
             "; first non-finite value (forward pass on the step's batch with the weights after "
             "it): ", why.empty() ? kNoneInForward : why,
             "; stopped (--on-nonfinite stop; skip drops such steps)",
             newest_checkpoint_text(o.checkpoint.dir, c));
      }
    } else {
      skipped_in_row = 0;
    }
    const bool counted = r.finite && std::isfinite(r.loss);
    if (!counted) r = runtime::StepResult{};
    const int64_t counted_targets = counted ? targets : 0;
    pos.epoch_loss_sum += r.loss * static_cast<double>(counted_targets);
    pos.epoch_correct += r.correct;
    pos.epoch_examples += n;
    pos.epoch_targets += counted_targets;
    pos.epoch_steps += 1;
    const double step_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    pos.epoch_seconds += step_seconds;
    if (s == res.start_step) {
      steady.first_step_seconds = step_seconds;
    } else {
      steady.steady_steps += 1;
      steady.steady_examples += n;
      steady.steady_seconds += step_seconds;
    }
    if (counted && c.tensorboard_every > 0 && (s + 1) % c.tensorboard_every == 0)
      board_write([&](TensorBoardWriter& tb) {
        EventFile& f = tb.train();
        f.scalar("batch_loss", s + 1, r.loss);
        if (ce) f.scalar("batch_accuracy", s + 1, r.correct / static_cast<double>(std::max<int64_t>(targets, 1)));
        f.scalar("batch_learning_rate", s + 1, trainer.lr_at(s));
        // Flushed now, not at the epoch's end: TensorBoard shows a long epoch's curve as it
        // goes (one small write per --tensorboard-every steps).
        f.flush();
      });
    const double seen = static_cast<double>(std::max<int64_t>(pos.epoch_targets, 1));
    const int64_t epoch = s / spe + 1;
    progress.step(epoch, s % spe + 1, pos.epoch_seconds, pos.epoch_loss_sum / seen,
                  ce ? std::optional<double>(pos.epoch_correct / seen) : std::nullopt);
    const bool epoch_end = (s + 1) % spe == 0 || s + 1 == res.total_steps;
    if (epoch_end) {
      EpochMetrics m = epoch_metrics(pos, epoch, ce, rate_unit);
      m.skipped = skipped;
      skipped = 0;
      m.overflowed = overflowed;
      overflowed = 0;
      m.loss_scale = trainer.loss_scaler().scale;
      m.first_step_seconds = steady.first_step_seconds;
      m.steady_steps = steady.steady_steps;
      m.steady_examples = steady.steady_examples;
      m.steady_seconds = steady.steady_seconds;
      m.max_rss_bytes = max_rss_bytes();
      steady = EpochMetrics{};
      if (validate) {
        train::EvalResult v = trainer.evaluate(*data.sets.val, *data.val_adapter, res.global_batch);
        m.val_loss = v.loss;
        m.val_accuracy = v.accuracy;
      }
      progress.epoch_done(m);
      if (bad_images > bad_noted && lead)
        std::fprintf(stderr,
                     "onnxtrain: warning: %lld unreadable image%s skipped so far (epoch %lld; "
                     "each replaced by the next readable one in the list; this process's rows)\n",
                     static_cast<long long>(bad_images), bad_images == 1 ? "" : "s",
                     static_cast<long long>(epoch));
      bad_noted = bad_images;
      board_write([&](TensorBoardWriter& tb) {
        // Keras' layout: epoch scalars at step = the epoch, 0-based.
        EventFile& f = tb.train();
        f.scalar("epoch_loss", epoch - 1, m.loss);
        if (m.accuracy) f.scalar("epoch_accuracy", epoch - 1, *m.accuracy);
        f.scalar("epoch_learning_rate", epoch - 1, trainer.lr_at(s));
        f.scalar("epoch_samples_per_second", epoch - 1,
                 static_cast<double>(m.examples) / std::max(m.seconds, 1e-9));
        if (m.val_loss) {
          EventFile& v = tb.validation();
          v.scalar("epoch_loss", epoch - 1, *m.val_loss);
          if (m.val_accuracy) v.scalar("epoch_accuracy", epoch - 1, *m.val_accuracy);
        }
        tb.flush();
      });
      if (metrics) {
        try {
          write_metrics_line(metrics.get(), m);
        } catch (const Error& e) {  // the metrics are a by-product: warn once, keep training
          std::fprintf(stderr, "onnxtrain: warning: %s; no more metrics are written\n", e.what());
          metrics.reset();
        }
      }
      res.epochs.push_back(m);
      pos = train::RunPosition{.step = s + 1, .steps_per_epoch = spe};
    }
    pos.step = s + 1;
    const int stop = StopSignals::agreed(world);
    const bool due = o.checkpoint.every > 0 ? (s + 1) % o.checkpoint.every == 0 : epoch_end;
    if (checkpoints && (due || s + 1 == res.total_steps || stop != 0)) trainer.save_checkpoint(pos);
    if (stop != 0 && s + 1 < res.total_steps) {
      res.stopped_by_signal = stop;
      std::fprintf(c.log, "%sstopped     %s after step %lld of %lld%s\n", c.live ? "\r\033[K" : "",
                   signal_name(stop), static_cast<long long>(s + 1),
                   static_cast<long long>(res.total_steps),
                   checkpoints ? cat("; checkpoint in '", o.checkpoint.dir,
                                     "': run the same command with --resume to continue").c_str()
                               : "; no --checkpoint-dir, so the run cannot be resumed");
      std::fflush(c.log);
      break;
    }
  }
  trainer.check_weights_agree();
  // Where the peak went: resident memory sampled at each stage before step 1 (libraries and
  // whatever the process held, the model and its graphs, the data, the plans with their first-
  // touched arenas and oneDNN primitives), then what the steps added on top.
  const int64_t peak = max_rss_bytes();
  if (plan.memory.total() > 0 && peak > 0 && rss_start > 0)
    std::fprintf(c.log,
                 "%smemory      peak %s resident: %s at start (libraries), %s model and training "
                 "graphs, %s data, %s plans before step 1 (planned %s x %d replica%s: arenas, "
                 "workspaces, state, buckets), %s during the steps (oneDNN and allocator caches, "
                 "batches in flight)\n",
                 c.live ? "\r\033[K" : "", bytes_text(peak).c_str(), bytes_text(rss_start).c_str(),
                 delta_text(rss_model - rss_start).c_str(), delta_text(rss_data - rss_model).c_str(),
                 delta_text(rss_prepared - rss_data).c_str(), bytes_text(plan.memory.total()).c_str(),
                 o.parallel.replicas, o.parallel.replicas == 1 ? "" : "s",
                 delta_text(peak - rss_prepared).c_str());
  if (!c.output.empty()) {
    try {
      trainer.export_model(c.output);
    } catch (const Error& e) {
      // The trained weights are not lost with the write: a rescue copy next to the checkpoints
      // (or in the working folder), named in the error. A non-finite model is never written.
      if (!trainer.nonfinite_state().empty()) throw;
      const fs::path dir = o.checkpoint.dir.empty() ? fs::current_path() : fs::path(o.checkpoint.dir);
      const std::string rescue = (dir / cat("onnxtrain-rescue-", ::getpid(), ".onnx")).string();
      try {
        trainer.export_model(rescue);
      } catch (const Error& e2) {
        fail(e.what(), "; the rescue copy failed too: ", e2.what());
      }
      fail(e.what(), "; the trained model was written to '", rescue, "' instead");
    }
    std::fprintf(c.log, "wrote %s\n", c.output.c_str());
  }
  std::fflush(c.log);
  return res;
}

}  // namespace onnxtrain::tools
