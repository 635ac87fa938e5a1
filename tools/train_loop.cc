// run_training (train_loop.h): checks every input before the first step, then steps the
// DataParallelSession through the loader, validating, reporting and checkpointing per epoch.
#include "tools/train_loop.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "ops/op_api.h"
#include "ops/plugin.h"
#include "runtime/checkpoint.h"
#include "runtime/data/loader.h"
#include "runtime/data_parallel.h"
#include "runtime/device/device.h"
#include "runtime/lr_schedule.h"
#include "runtime/session.h"
#include "tools/train_report.h"

namespace onnxtrain::tools {

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The device of each of this process's replicas (--device). "cuda": replica k of local process
// l drives GPU l*R+k, so R replicas x L processes need R*L GPUs on the machine.
std::vector<std::shared_ptr<runtime::Device>> replica_devices(const TrainConfig& c) {
  const std::string spec = c.device.empty() ? runtime::default_device_spec() : c.device;
  std::vector<std::shared_ptr<runtime::Device>> out;
  if (spec == "cuda") {
    const int gpus = runtime::cuda_device_count();
    OT_CHECK(runtime::cuda_built(), "--device cuda: this onnxtrain was built without the CUDA "
             "backend (use --device cpu)");
    const int first = c.local_rank * c.replicas;
    OT_CHECK(gpus >= first + c.replicas, "--device cuda: ", c.replicas, " replica",
             c.replicas == 1 ? "" : "s",
             c.local_rank > 0 ? cat(" of local process ", c.local_rank) : std::string(), " need GPU",
             c.replicas == 1 ? cat(" ", first) : cat("s ", first, "..", first + c.replicas - 1),
             ", this machine has ", gpus);
    for (int k = 0; k < c.replicas; ++k) out.push_back(runtime::make_device(cat("cuda:", first + k)));
  } else if (spec.rfind("cuda:", 0) == 0) {
    OT_CHECK(c.replicas == 1, "--device ", spec, " names one GPU; with --replicas ", c.replicas,
             " use --device cuda (replica k on GPU k)");
    out.push_back(runtime::make_device(spec));
  } else if (spec == "cpu" || spec == "sim") {
    // One device object per replica: "sim" (tests) keeps per-replica memory like GPUs do.
    for (int k = 0; k < c.replicas; ++k) out.push_back(runtime::make_device(spec));
  } else {
    fail("--device '", spec, "': expected cpu, cuda or cuda:N");
  }
  runtime::set_cuda_tf32(c.tf32);
  return out;
}

std::string devices_text(const std::vector<std::shared_ptr<runtime::Device>>& devices) {
  std::string out;
  for (const auto& d : devices) {
    if (d->name() == "cpu") return "cpu";
    out += (out.empty() ? "" : ", ") + d->name();
  }
  return out;
}

// --threads 0: the CPUs this process may run on; when a launcher started several processes on
// this machine without binding them, an equal share each (two unbound ranks on a 2-core machine
// would otherwise run 2 threads each on 2 cores).
int default_threads(int local_processes) {
  int cpus = static_cast<int>(runtime::allowed_cpus().size());
  const int machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (cpus <= 0) cpus = machine;
  if (local_processes > 1 && cpus >= machine) cpus /= local_processes;
  return std::max(1, cpus);
}
using graph::Tensor;

constexpr int kKeepCheckpoints = 3;
constexpr const char* kCheckpointFormat = "onnxtrain-checkpoint/1";

std::string read_model_bytes(const std::string& path) {
  std::error_code ec;
  OT_CHECK(fs::is_regular_file(path, ec), "model file '", path,
           "' does not exist or is not a file");
  std::ifstream in(path, std::ios::binary);
  OT_CHECK(in, "cannot open model file '", path, "': ", std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  OT_CHECK(!in.bad(), "cannot read model file '", path, "'");
  return s.str();
}

// Same file, also when one of them does not exist yet (then compared as absolute paths).
bool same_path(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
  return fs::weakly_canonical(fs::absolute(a), ec) == fs::weakly_canonical(fs::absolute(b), ec);
}

// The model's batch input: the first graph input without an initializer, dims past the batch.
struct ModelInput {
  std::string name;
  std::vector<int64_t> dims;
};

ModelInput model_input(const graph::Model& m, const std::string& path) {
  for (const graph::Value* v : m.graph->inputs()) {
    if (v->has_initializer()) continue;
    OT_CHECK(v->type.is_tensor() && v->shape() && !v->shape()->empty(), path, ": input '",
             v->name(), "' needs a tensor type with a batch dimension");
    ModelInput in{v->name(), {}};
    for (size_t i = 1; i < v->shape()->size(); ++i) {
      const graph::Dim& d = (*v->shape())[i];
      OT_CHECK(d.is_known(), path, ": input '", v->name(), "' dimension ", i,
               " is not a fixed size (onnxtrain needs one example shape)");
      in.dims.push_back(d.value);
    }
    return in;
  }
  fail(path, ": the model has no input to feed (every graph input has an initializer)");
}

// Dims past the batch of `name` in a typed model; empty when unknown.
std::vector<int64_t> output_dims(const graph::Model& m, const std::string& name) {
  const graph::Value* v = m.graph->find_value(name);
  std::vector<int64_t> dims;
  if (!v || !v->shape()) return dims;
  for (size_t i = 1; i < v->shape()->size(); ++i) {
    if (!(*v->shape())[i].is_known()) return {};
    dims.push_back((*v->shape())[i].value);
  }
  return dims;
}

struct ValResult {
  double loss = 0;
  std::optional<double> accuracy;
};

// The input of `role` in a graph's training signature (one the passes always create).
const std::string& input_named(const graph::TrainingSignature& sig, graph::InputRole role) {
  const graph::InputBinding* b = sig.find_input(role);
  OT_CHECK(b, "training graph: its signature has no ", graph::input_role_name(role), " input");
  return b->name;
}

// The evaluation graph's loss and correct outputs are summed over the validation set; its
// state inputs are fed the current training state (by single-replica name).
ValResult evaluate(runtime::InferenceSession& s, const std::map<std::string, Tensor>& state,
                   const runtime::Dataset& val, const runtime::InputAdapter& adapter,
                   int64_t batch, bool cross_entropy) {
  const graph::TrainingSignature& sig = s.model().training;
  std::map<std::string, Tensor> feeds;
  for (const graph::InputBinding* b : sig.inputs_with(graph::InputRole::kState))
    feeds[b->name] = state.at(b->name);
  feeds[input_named(sig, graph::InputRole::kLossScale)] =
      Tensor::from_vector(graph::DataType::kFloat, {}, std::vector<float>{1.0f});
  const std::string& input_name = input_named(sig, graph::InputRole::kBatch);
  const std::string& truth_name = input_named(
      sig, cross_entropy ? graph::InputRole::kLabels : graph::InputRole::kTargets);
  int loss_at = -1, correct_at = -1;
  const auto& outs = s.model().graph->outputs();
  for (size_t i = 0; i < outs.size(); ++i)
    for (const graph::ResultBinding& r : sig.results)
      if (r.name == outs[i]->name())
        (r.role == graph::ResultRole::kLoss ? loss_at : correct_at) = static_cast<int>(i);
  OT_CHECK(loss_at >= 0, "validation graph has no loss output");
  runtime::LoaderOptions lo;
  lo.batch_size = batch;
  lo.shuffle = false;
  runtime::DataLoader loader(val, adapter, lo);
  double loss_sum = 0, correct = 0;
  for (int64_t i = 0; i < loader.steps_per_epoch(); ++i) {
    runtime::Batch b = loader.next();
    feeds[input_name] = std::move(b.inputs);
    feeds[truth_name] = std::move(b.targets);
    std::vector<Tensor> r = s.run(feeds);
    loss_sum += static_cast<double>(r[loss_at].data_as<float>()[0]);
    if (correct_at >= 0) correct += static_cast<double>(r[correct_at].data_as<float>()[0]);
  }
  ValResult out;
  const double n = static_cast<double>(val.size());
  out.loss = loss_sum / n;
  if (cross_entropy && correct_at >= 0) out.accuracy = correct / n;
  return out;
}

std::string f2s(double v) {
  return cat(v);
}

// Exact text of a double (checkpointed running sums must resume bit for bit).
std::string bits_of(double v) {
  return std::to_string(std::bit_cast<uint64_t>(v));
}
double from_bits(const std::string& s) {
  return std::bit_cast<double>(std::stoull(s));
}

int64_t meta_int(const runtime::Checkpoint& c, const std::string& key, const std::string& path) {
  const std::string& v = c.meta(key);
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  fail(path, ": metadata '", key, "' is not an integer: '", v, "'");
}

// The options that change the math, as (key, value): a resumed run must match them all.
std::vector<std::pair<std::string, std::string>> math_options(const TrainConfig& c,
                                                              const std::string& model_bytes,
                                                              int64_t global_batch, int processes) {
  const auto& o = c.graph.optimizer;
  std::string norm = "default";
  if (c.normalization) {
    norm = "mean=";
    for (float x : c.normalization->mean) norm += f2s(x) + ",";
    norm += " std=";
    for (float x : c.normalization->std) norm += f2s(x) + ",";
  }
  char model_hash[17];
  std::snprintf(model_hash, sizeof model_hash, "%016llx",
                static_cast<unsigned long long>(fnv1a64(model_bytes)));
  std::vector<std::pair<std::string, std::string>> opts = {
      {"model", model_hash},
      {"optimizer", cat(c.optimizer_name, " momentum=", o.momentum, " nesterov=", o.nesterov,
                        " weight_decay=", o.weight_decay, " clip_norm=", o.clip_global_norm)},
      {"lr", f2s(c.lr)},
      {"lr_schedule", c.lr_schedule},
      {"global_batch", std::to_string(global_batch)},
      {"replicas", std::to_string(c.replicas)},
      {"seed", std::to_string(c.seed)},
      {"data", c.data + " val_split=" + f2s(c.val_split) + " " + norm},
      {"loss", std::to_string(static_cast<int>(c.graph.loss))},
      {"output_name", c.graph.output},
      {"trainable", "freeze=" + c.graph.trainable.freeze_regex +
                        " trainable=" + c.graph.trainable.trainable_regex},
  };
  // Only when it changes the math, so checkpoints written before the flag existed still match.
  if (c.sync_batchnorm && c.replicas * processes > 1) opts.emplace_back("sync_batchnorm", "1");
  if (processes > 1) opts.emplace_back("processes", std::to_string(processes));
  return opts;
}

std::string options_hash(const std::vector<std::pair<std::string, std::string>>& opts) {
  uint64_t h = fnv1a64("onnxtrain-options");
  for (const auto& [k, v] : opts) h = fnv1a64(v, fnv1a64(k + "=", h)) * 31 + 1;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Running sums of the epoch in progress (checkpointed, so a resumed epoch reports the same).
struct EpochAccum {
  double loss_sum = 0, correct = 0, seconds = 0;
  int64_t examples = 0, steps = 0;
};

struct ResumePoint {
  int64_t step = 0;
  EpochAccum accum;
};

// A run killed while writing a checkpoint leaves its temporary file (ckpt-<step>.otck.tmp.<pid>);
// the resumed run owns the folder, so those go.
void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("ckpt-") && name.find(".otck.tmp.") != std::string::npos)
      fs::remove(e.path(), ec);
  }
}

ResumePoint resume_from(const TrainConfig& c, runtime::DataParallelSession& session,
                        const std::vector<std::pair<std::string, std::string>>& opts,
                        const std::string& hash, int64_t steps_per_epoch) {
  std::vector<std::string> skipped;
  std::optional<runtime::LoadedCheckpoint> got =
      runtime::load_latest_checkpoint(c.checkpoint_dir, &skipped);
  OT_CHECK(got, "--resume: no readable checkpoint (ckpt-<step>.otck) in '", c.checkpoint_dir, "'",
           skipped.empty() ? std::string() : cat(" (skipped: ", skipped.front(), ")"));
  const runtime::Checkpoint& ck = got->ckpt;
  const std::string& path = got->file.path;
  OT_CHECK(ck.metadata.count("format") && ck.meta("format") == kCheckpointFormat, path,
           ": not an onnxtrain training checkpoint (metadata 'format' is not ", kCheckpointFormat,
           ")");
  if (ck.meta("options_hash") != hash) {
    std::string diff;
    for (const auto& [k, v] : opts) {
      auto it = ck.metadata.find("opt." + k);
      const std::string was = it == ck.metadata.end() ? "?" : it->second;
      if (was != v) diff += cat(diff.empty() ? "" : ", ", k, " '", was, "' -> '", v, "'");
    }
    fail("--resume: ", path, " was written with different options (",
         diff.empty() ? "options hash" : diff,
         "); resume with the original options or use a new --checkpoint-dir");
  }
  std::map<std::string, Tensor> state = session.state();
  for (auto& [name, t] : state) {
    const Tensor* saved = ck.find_tensor(name);
    OT_CHECK(saved, path, ": no tensor '", name, "' (the training graph's state)");
    t = *saved;
  }
  session.set_state(state);
  remove_stale_temporaries(c.checkpoint_dir);
  ResumePoint r;
  r.step = meta_int(ck, "step", path);
  OT_CHECK(meta_int(ck, "loader_epoch", path) == r.step / steps_per_epoch &&
               meta_int(ck, "loader_step", path) == r.step % steps_per_epoch,
           path, ": loader position does not match step ", r.step, " at ", steps_per_epoch,
           " steps per epoch");
  r.accum.loss_sum = from_bits(ck.meta("epoch_loss_sum"));
  r.accum.correct = from_bits(ck.meta("epoch_correct"));
  r.accum.seconds = from_bits(ck.meta("epoch_seconds"));
  r.accum.examples = meta_int(ck, "epoch_examples", path);
  r.accum.steps = meta_int(ck, "epoch_steps", path);
  return r;
}

void save_checkpoint(const TrainConfig& c, const runtime::DataParallelSession& session,
                     const std::vector<std::pair<std::string, std::string>>& opts,
                     const std::string& hash, int64_t step, int64_t steps_per_epoch,
                     const EpochAccum& a) {
  runtime::Checkpoint ck;
  ck.metadata["format"] = kCheckpointFormat;
  ck.metadata["options_hash"] = hash;
  for (const auto& [k, v] : opts) ck.metadata["opt." + k] = v;
  ck.metadata["step"] = std::to_string(step);
  ck.metadata["epoch"] = std::to_string(step / steps_per_epoch);
  ck.metadata["loader_epoch"] = std::to_string(step / steps_per_epoch);
  ck.metadata["loader_step"] = std::to_string(step % steps_per_epoch);
  // The shuffle order is a pure function of (seed, epoch) and the step's random seed (Dropout)
  // one of (seed, step): the seed and the step are the whole RNG state.
  ck.metadata["seed"] = std::to_string(c.seed);
  ck.metadata["epoch_loss_sum"] = bits_of(a.loss_sum);
  ck.metadata["epoch_correct"] = bits_of(a.correct);
  ck.metadata["epoch_seconds"] = bits_of(a.seconds);
  ck.metadata["epoch_examples"] = std::to_string(a.examples);
  ck.metadata["epoch_steps"] = std::to_string(a.steps);
  for (auto& [name, t] : session.state()) ck.add_tensor(name, std::move(t));
  const fs::path file = fs::path(c.checkpoint_dir) / runtime::checkpoint_file_name(step);
  runtime::write_checkpoint(file.string(), ck);
  runtime::prune_checkpoints(c.checkpoint_dir, kKeepCheckpoints);
}

// Every process hashes each item and compares with rank 0; a difference is the same one-line
// error on every process ("processes disagree <when> (rank 1 differs from rank 0 in lr)").
void check_same(runtime::ProcessWorld& w, const std::vector<std::pair<std::string, std::string>>& items,
                const std::string& when) {
  std::vector<int64_t> mine;
  for (const auto& [k, v] : items) mine.push_back(static_cast<int64_t>(fnv1a64(v, fnv1a64(k + "="))));
  const int p = w.size();
  int64_t count = static_cast<int64_t>(mine.size());
  std::vector<int64_t> counts(static_cast<size_t>(p));
  w.all_gather(&count, counts.data(), 1, graph::DataType::kInt64, "setup check");
  for (int r = 1; r < p; ++r)
    if (counts[r] != counts[0])
      throw runtime::WorldConsistentError(
          cat("processes disagree ", when, ": rank ", r, " compares ", counts[r],
              " setup items, rank 0 ", counts[0], " (different onnxtrain versions?)"));
  std::vector<int64_t> all(static_cast<size_t>(count * p));
  w.all_gather(mine.data(), all.data(), count, graph::DataType::kInt64, "setup check");
  std::string diff;
  for (int r = 1; r < p; ++r)
    for (int64_t i = 0; i < count; ++i)
      if (all[static_cast<size_t>(r * count + i)] != all[static_cast<size_t>(i)])
        diff += cat(diff.empty() ? "" : ", ", "rank ", r, " differs from rank 0 in ", items[i].first);
  if (!diff.empty())
    throw runtime::WorldConsistentError(
        cat("processes disagree ", when, " (", diff,
            "); every process must run the same model, data and options"));
}

// Rank 0 read the checkpoint; the others get its state and position.
void share_resume(runtime::ProcessWorld& w, runtime::DataParallelSession& session, ResumePoint& rp) {
  int64_t ints[3] = {rp.step, rp.accum.examples, rp.accum.steps};
  double reals[3] = {rp.accum.loss_sum, rp.accum.correct, rp.accum.seconds};
  w.broadcast(ints, 3, graph::DataType::kInt64, 0, "resume position");
  w.broadcast(reals, 3, graph::DataType::kDouble, 0, "resume position");
  rp.step = ints[0];
  rp.accum.examples = ints[1];
  rp.accum.steps = ints[2];
  rp.accum.loss_sum = reals[0];
  rp.accum.correct = reals[1];
  rp.accum.seconds = reals[2];
  std::map<std::string, Tensor> state = session.state();
  for (auto& [name, t] : state)
    w.broadcast(t.mutable_data(), static_cast<int64_t>(t.nbytes()), graph::DataType::kUInt8, 0,
                "resume state");
  session.set_state(state);
}

void check_config(const TrainConfig& c) {
  OT_CHECK(c.replicas >= 1, "--replicas must be >= 1, got ", c.replicas);
  OT_CHECK(c.model_path.empty() || c.output.empty() || !same_path(c.model_path, c.output),
           "--output '", c.output, "' is the input model; choose another file");
  OT_CHECK(c.model_path.empty() || c.save_graph.empty() || !same_path(c.model_path, c.save_graph),
           "--save-graph '", c.save_graph, "' is the input model; choose another file");
  for (const auto& [flag, file] : {std::pair<const char*, const std::string&>{"--output", c.output},
                                   {"--save-graph", c.save_graph},
                                   {"--metrics-json", c.metrics_json},
                                   {"--profile", c.profile}}) {
    if (file.empty()) continue;
    // A missing folder would only show after training, when the file is written.
    const fs::path parent = fs::absolute(file).parent_path();
    std::error_code ec;
    OT_CHECK(fs::is_directory(parent, ec), flag, " '", file, "': folder '", parent.string(),
             "' does not exist");
  }
  OT_CHECK(!c.resume || !c.checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  OT_CHECK(c.epochs >= 1 && c.steps >= 0, "--epochs must be >= 1 and --steps >= 0");
  OT_CHECK(c.batch_size >= 1 && c.global_batch >= 0, "batch sizes must be >= 1");
  OT_CHECK(c.checkpoint_every >= 0, "--checkpoint-every must be >= 0");
}

}  // namespace

TrainResult run_training(const TrainConfig& config) {
  runtime::ProcessWorld* world = config.world && config.world->size() > 1 ? config.world : nullptr;
  const int procs = world ? world->size() : 1;
  const bool lead = !world || world->rank() == 0;
  // The other processes compute the same and write nothing: no output, files or checkpoints.
  TrainConfig c = config;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> quiet(nullptr, [](std::FILE* f) { return f ? std::fclose(f) : 0; });
  if (!lead) {
    quiet.reset(std::fopen("/dev/null", "w"));
    OT_CHECK(quiet, "cannot open /dev/null: ", std::strerror(errno));
    c.log = quiet.get();
    c.live = false;
    c.output.clear();
    c.save_graph.clear();
    c.metrics_json.clear();
    if (!c.profile.empty()) c.profile += cat(".p", world->rank());
  }
  check_config(c);
  // Syntax of the data specs first: a typo should not wait for the model to load.
  runtime::parse_data_spec(c.data);
  if (!c.val_data.empty() && c.val_data != "none") runtime::parse_data_spec(c.val_data);
  runtime::LrSchedule schedule = runtime::parse_lr_schedule(c.lr_schedule, c.lr);

  // Custom ops first: the importer and everything after it look ops up in the registry.
  for (const std::string& lib : c.custom_op_libs) ops::load_op_library(lib);
  const std::string model_bytes = read_model_bytes(c.model_path);
  std::unique_ptr<graph::Model> original = graph::import_onnx_bytes(
      model_bytes, c.model_path, fs::path(c.model_path).parent_path().string());
  runtime::require_supported_ops(*original, c.model_path);
  const ModelInput input = model_input(*original, c.model_path);
  auto training_graph = original->clone();
  passes::TrainingOptions topts = c.graph;
  topts.replicas = c.replicas;
  const std::vector<std::shared_ptr<runtime::Device>> devices = replica_devices(c);
  // Placement for people reading the graph (partitions follow the recorded replica index).
  for (int k = 0; k < c.replicas; ++k) topts.devices.push_back(devices[static_cast<size_t>(k)]->name());
  topts.bucket_mb = c.bucket_mb;
  topts.sync_batchnorm = c.sync_batchnorm;  // replicate's; with 1 replica there is nothing to sync
  topts.collectives = world != nullptr;      // R == 1 too: the AllReduce spans the processes
  passes::TrainingGraphInfo info = passes::build_training_graph(*training_graph, topts);
  const bool ce = info.loss.kind == passes::LossKind::kCrossEntropy;
  // The trained output's dims from the typed inference model (replicated graphs rename it).
  std::unique_ptr<graph::Model> typed = original->clone();
  passes::infer_shapes(*typed);
  const std::vector<int64_t> out_dims = output_dims(*typed, info.prepared.logits);
  const int64_t classes = ce && !out_dims.empty() ? out_dims.back() : 0;
  if (!c.save_graph.empty()) graph::export_onnx_file(*training_graph, c.save_graph);

  // Data.
  runtime::DataConfig dc{c.data, c.val_data, c.val_split, c.seed};
  runtime::LoadOptions lo{input.dims, classes, c.seed};
  runtime::TrainValData data = runtime::load_train_val(dc, lo);
  for (const runtime::Dataset* d : {&data.train, data.val ? &*data.val : nullptr}) {
    if (!d) continue;
    if (ce) {
      OT_CHECK(d->has_labels(), d->name(), ": has float targets but the loss is cross-entropy ",
               "on '", info.prepared.logits, "' (give --loss mse)");
      d->check_labels(classes);
    } else {
      OT_CHECK(!d->has_labels(), d->name(), ": has class labels but the loss is mse on '",
               info.prepared.logits, "' (give --loss cross-entropy, or float targets)");
      OT_CHECK(out_dims.empty() || d->target_shape() == out_dims, d->name(),
               ": target shape does not match output '", info.prepared.logits, "'");
    }
  }
  const runtime::InputAdapter adapter =
      runtime::InputAdapter::for_dataset(data.train, input.dims, c.normalization);
  std::optional<runtime::InputAdapter> val_adapter;
  if (data.val)
    val_adapter = runtime::InputAdapter::for_dataset(*data.val, input.dims, c.normalization);

  TrainResult res;
  const int all_replicas = c.replicas * procs;
  res.global_batch = c.global_batch > 0 ? c.global_batch : c.batch_size * all_replicas;
  OT_CHECK(res.global_batch >= all_replicas, "--global-batch-size ", res.global_batch,
           " is smaller than the ", all_replicas, " replicas of ", procs, " processes");
  res.steps_per_epoch = runtime::steps_per_epoch(data.train.size(), res.global_batch);
  res.total_steps = c.steps > 0 ? c.steps : c.epochs * res.steps_per_epoch;
  const int64_t spe = res.steps_per_epoch;
  const int64_t epochs = (res.total_steps + spe - 1) / spe;
  if (schedule.kind == runtime::LrSchedule::Kind::kCosine && schedule.total_steps == 0)
    schedule.total_steps = res.total_steps;
  int64_t allreduce_bytes = 0;
  for (const std::string& p : info.prepared.params) {
    const graph::Value* v = original->graph->find_value(p);
    if (v && v->has_initializer()) {
      res.trainable_parameters += v->initializer().numel();
      allreduce_bytes += static_cast<int64_t>(v->initializer().nbytes());
    }
  }
  const auto opts = math_options(c, model_bytes, res.global_batch, procs);
  const std::string hash = options_hash(opts);
  if (world) {
    std::vector<std::pair<std::string, std::string>> setup = opts;
    if (!c.sync_batchnorm || all_replicas == 1) setup.emplace_back("sync_batchnorm", "0");
    std::string buckets;
    for (size_t b = 0; b < info.buckets.num_buckets(); ++b) {
      buckets += cat(info.buckets.bytes[b], ":");
      for (const std::string& p : info.buckets.params[b]) buckets += p + ",";
      buckets += ";";
    }
    setup.emplace_back("training graph", cat(fnv1a64(graph::export_onnx_bytes(*training_graph))));
    setup.emplace_back("bucket layout", buckets);
    setup.emplace_back("replicas per process", std::to_string(c.replicas));
    setup.emplace_back("steps", cat(res.total_steps, " of ", res.steps_per_epoch, " per epoch, ",
                                    data.train.size(), " examples"));
    setup.emplace_back("resume", c.resume ? "1" : "0");
    check_same(*world, setup, "before step 1");
  }

  // Files that must be writable before training starts.
  std::FILE* metrics = nullptr;
  if (!c.metrics_json.empty()) {
    metrics = std::fopen(c.metrics_json.c_str(), "a");
    OT_CHECK(metrics, "--metrics-json '", c.metrics_json, "': ", std::strerror(errno));
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> metrics_owner(
      metrics, [](std::FILE* f) { return f ? std::fclose(f) : 0; });
  if (!c.checkpoint_dir.empty() && lead) {
    std::error_code ec;
    fs::create_directories(c.checkpoint_dir, ec);
    OT_CHECK(fs::is_directory(c.checkpoint_dir), "--checkpoint-dir '", c.checkpoint_dir,
             "': cannot create the folder", ec ? cat(": ", ec.message()) : "");
  }

  // Sessions.
  runtime::SessionOptions so;
  so.threads = c.threads > 0 ? c.threads : default_threads(world ? c.local_processes : 1);
  so.profile_path = c.profile;
  so.replica_devices = devices;
  runtime::DataParallelSession session(passes::partition_replicas(*training_graph), so, world);
  std::unique_ptr<runtime::InferenceSession> val_session;
  if (data.val && lead) {
    runtime::SessionOptions vo;
    vo.threads = so.threads;
    vo.device = devices.front();  // replica 0's GPU (idle while validation runs)
    std::vector<std::string> state_names;
    for (const auto& [name, t] : session.state()) state_names.push_back(name);
    val_session = std::make_unique<runtime::InferenceSession>(
        passes::build_evaluation_graph(*original, c.graph, info.loss.kind, state_names), vo);
  }
  const std::string& truth_input = input_named(
      training_graph->training, ce ? graph::InputRole::kLabels : graph::InputRole::kTargets);

  EpochAccum acc;
  if (c.resume) {
    ResumePoint rp;
    if (lead) rp = resume_from(c, session, opts, hash, spe);
    if (world) share_resume(*world, session, rp);
    res.start_step = std::min(rp.step, res.total_steps);
    acc = rp.accum;
  }

  const PlanFacts plan{.model_path = c.model_path,
                       .input_name = input.name,
                       .input_dims = input.dims,
                       .output_name = info.prepared.logits,
                       .classes = classes,
                       .train_name = data.train.name(),
                       .train_examples = data.train.size(),
                       .val_name = data.val ? data.val->name() : "",
                       .val_examples = data.val ? data.val->size() : 0,
                       .adapter = adapter.describe(),
                       .info = info,
                       .result = res,
                       .epochs = epochs,
                       .threads_per_replica = std::max(1, so.threads / c.replicas),
                       .devices = devices_text(devices),
                       .processes = procs,
                       .allreduce_bytes = allreduce_bytes};
  print_plan(c, plan);

  runtime::LoaderOptions tl;
  tl.batch_size = res.global_batch;
  tl.seed = c.seed;
  runtime::DataLoader loader(data.train, adapter, tl,
                             runtime::LoaderPosition{res.start_step / spe, res.start_step % spe});
  Progress progress(c, spe, epochs);
  for (int64_t s = res.start_step; s < res.total_steps; ++s) {
    const auto t0 = Clock::now();
    runtime::Batch b = loader.next();
    std::map<std::string, Tensor> feeds;
    const int64_t n = b.size();
    if (world) {
      // This process's replicas p*R .. p*R+R-1 of the global split; its ShardBatch nodes then
      // split these rows over R by the same rule, which reproduces the global split.
      const auto [start, rows] =
          runtime::shard_range(n, all_replicas, world->rank() * c.replicas, c.replicas);
      b.inputs = runtime::slice_rows(b.inputs, start, rows);
      b.targets = runtime::slice_rows(b.targets, start, rows);
    }
    feeds[input.name] = std::move(b.inputs);
    feeds[truth_input] = std::move(b.targets);
    const float lr = runtime::lr_at(schedule, s);
    // The step's random numbers (Dropout) are a function of (--seed, step): a resumed run
    // draws what the uninterrupted one drew.
    const uint64_t step_seed =
        runtime::DataParallelSession::mix_seed(static_cast<uint64_t>(c.seed), static_cast<uint64_t>(s));
    runtime::StepResult r = session.step(feeds, lr, 1.0f / static_cast<float>(n), step_seed);
    acc.loss_sum += r.loss * static_cast<double>(n);
    acc.correct += r.correct;
    acc.examples += n;
    acc.steps += 1;
    acc.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    const int64_t epoch = s / spe + 1;
    progress.step(
        epoch, s % spe + 1, acc.seconds, acc.loss_sum / static_cast<double>(acc.examples),
        ce ? std::optional<double>(acc.correct / static_cast<double>(acc.examples)) : std::nullopt);
    const bool epoch_end = (s + 1) % spe == 0 || s + 1 == res.total_steps;
    if (epoch_end) {
      EpochMetrics m;
      m.epoch = epoch;
      m.steps = acc.steps;
      m.examples = acc.examples;
      m.seconds = acc.seconds;
      m.loss = acc.loss_sum / static_cast<double>(acc.examples);
      if (ce) m.accuracy = acc.correct / static_cast<double>(acc.examples);
      if (val_session) {
        ValResult v = evaluate(*val_session, session.state(), *data.val, *val_adapter,
                               res.global_batch, ce);
        m.val_loss = v.loss;
        m.val_accuracy = v.accuracy;
      }
      progress.epoch_done(m);
      if (metrics) write_metrics_line(metrics, m);
      res.epochs.push_back(m);
      acc = EpochAccum{};
    }
    const bool due = c.checkpoint_every > 0 ? (s + 1) % c.checkpoint_every == 0 : epoch_end;
    if (!c.checkpoint_dir.empty() && lead && (due || s + 1 == res.total_steps))
      save_checkpoint(c, session, opts, hash, s + 1, spe, acc);
  }
  if (world) {
    // The collectives give every replica of every process the same bytes; verify it once.
    OT_CHECK(session.replicas_identical(), "rank ", world->rank(),
             ": the replicas of this process ended with different weights");
    uint64_t h = fnv1a64("state");
    for (const auto& [name, t] : session.state())
      h = fnv1a64(std::string_view(reinterpret_cast<const char*>(t.data()), t.nbytes()),
                  fnv1a64(name, h));
    check_same(*world, {{"trained weights", cat(h)}}, "after training");
  }
  if (!c.output.empty()) {
    graph::export_onnx_file(*session.trained_model(*original), c.output);
    std::fprintf(c.log, "wrote %s\n", c.output.c_str());
  }
  std::fflush(c.log);
  return res;
}

}  // namespace onnxtrain::tools
