// train::Trainer (trainer.h): model -> training graph -> DataParallelSession, with the data,
// evaluation, checkpoints and the multi-process setup check around it.
#include "train/trainer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "ops/plugin.h"
#include "ops/precision.h"
#include "runtime/checkpoint.h"
#include "runtime/finite.h"

namespace onnxtrain::train {
namespace {

namespace fs = std::filesystem;
using graph::Tensor;

constexpr int kKeepCheckpoints = 3;

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

BatchInput batch_input_of(const graph::Model& m, const std::string& path) {
  for (const graph::Value* v : m.graph->inputs()) {
    if (v->has_initializer()) continue;
    OT_CHECK(v->type.is_tensor() && v->shape() && !v->shape()->empty(), path, ": input '",
             v->name(), "' needs a tensor type with a batch dimension");
    BatchInput in{v->name(), {}};
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

// The rows of the table a Gather indexes with `v` (through shape-only ops and casts); 0 when
// `v` indexes no initializer table. The smallest when it indexes several.
int64_t id_bound_of(const graph::Value* v, int depth = 0) {
  int64_t bound = 0;
  auto take = [&](int64_t b) {
    if (b > 0) bound = bound == 0 ? b : std::min(bound, b);
  };
  for (const graph::Use& u : v->uses()) {
    const graph::Node* n = u.node;
    const std::string& op = n->op_type;
    if (op == "Gather" && u.input_index == 1) {
      const graph::Value* table = n->inputs()[0];
      const int64_t axis = n->attr_int("axis", 0);
      if (table && table->has_initializer() && axis == 0 && table->initializer().rank() >= 1)
        take(table->initializer().dims()[0]);
    } else if (depth < 4 && (op == "Cast" || op == "Reshape" || op == "Unsqueeze" ||
                             op == "Squeeze" || op == "Identity" || op == "Flatten") &&
               u.input_index == 0 && !n->outputs().empty()) {
      take(id_bound_of(n->outputs()[0], depth + 1));
    }
  }
  return bound;
}

std::vector<runtime::ModelInput> model_inputs_of(const graph::Model& m) {
  std::vector<runtime::ModelInput> out;
  for (const graph::Value* v : m.graph->inputs()) {
    if (v->has_initializer() || !v->type.is_tensor()) continue;
    runtime::ModelInput in;
    in.name = v->name();
    in.dtype = v->dtype();
    if (v->shape())
      for (size_t i = 1; i < v->shape()->size(); ++i) {
        const graph::Dim& d = (*v->shape())[i];
        in.dims.push_back(d.is_known() ? d.value : -1);
      }
    if (!graph::is_float_dtype(in.dtype)) in.id_bound = id_bound_of(v);
    out.push_back(std::move(in));
  }
  return out;
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

// Cross-entropy's class axis from the labels of one example: logits (N, d1..dk, C) with labels
// (d1..dk) that do not also fit (N, C, d1..dk) mean the classes are last (-1: an LM head's
// (N, T, C) with per-token labels (N, T)); anything else keeps torch's axis 1. Needs the output's
// static dims past the batch (the output named, or the model's only one).
int64_t infer_class_axis(const graph::Model& typed, const std::string& output,
                         const std::vector<int64_t>& label_dims) {
  if (label_dims.empty()) return 1;
  const graph::Graph& g = *typed.graph;
  std::string name = output;
  if (name.empty() && g.outputs().size() == 1) name = g.outputs()[0]->name();
  if (name.empty()) return 1;
  const std::vector<int64_t> dims = output_dims(typed, name);
  if (dims.size() != label_dims.size() + 1) return 1;
  const std::vector<int64_t> last(dims.begin(), dims.end() - 1), first(dims.begin() + 1, dims.end());
  return label_dims == last && label_dims != first ? -1 : 1;
}

// The input of `role` in a graph's training signature (one the passes always create).
const std::string& input_named(const graph::TrainingSignature& sig, graph::InputRole role) {
  const graph::InputBinding* b = sig.find_input(role);
  OT_CHECK(b, "training graph: its signature has no ", graph::input_role_name(role), " input");
  return b->name;
}

passes::TrainingOptions graph_options(const Options& o) {
  passes::TrainingOptions t;
  t.trainable = o.model.trainable;
  t.output = o.model.output;
  t.loss = o.model.loss;
  t.class_axis = o.model.class_axis;
  t.ignore_index = o.model.ignore_index;
  t.optimizer = o.optimizer;
  t.precision = o.model.precision;
  t.conv_algorithm = o.model.conv_algorithm;
  t.block_layout = o.model.blocked_layout;
  t.fuse_batchnorm_relu = o.model.fuse_batchnorm_relu;
  t.keep_weight_copies = o.model.weight_copies;
  return t;
}

std::string hex16(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

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

// Every process hashes each item and compares with rank 0; a difference is the same one-line
// error on every process ("processes disagree <when> (rank 1 differs from rank 0 in lr)").
void check_same(runtime::ProcessWorld& w,
                const std::vector<std::pair<std::string, std::string>>& items,
                const std::string& when) {
  std::vector<int64_t> mine;
  for (const auto& [k, v] : items)
    mine.push_back(static_cast<int64_t>(fnv1a64(v, fnv1a64(k + "="))));
  const int p = w.size();
  int64_t count = static_cast<int64_t>(mine.size());
  std::vector<int64_t> counts(static_cast<size_t>(p));
  w.all_gather(&count, counts.data(), 1, graph::DataType::kInt64, "setup check");
  for (int r = 1; r < p; ++r)
    if (counts[r] != counts[0])
      throw runtime::WorldConsistentError(cat("processes disagree ", when, ": rank ", r,
                                              " compares ", counts[r], " setup items, rank 0 ",
                                              counts[0], " (different onnxtrain versions?)"));
  std::vector<int64_t> all(static_cast<size_t>(count * p));
  w.all_gather(mine.data(), all.data(), count, graph::DataType::kInt64, "setup check");
  std::string diff;
  for (int r = 1; r < p; ++r)
    for (int64_t i = 0; i < count; ++i)
      if (all[static_cast<size_t>(r * count + i)] != all[static_cast<size_t>(i)])
        diff +=
            cat(diff.empty() ? "" : ", ", "rank ", r, " differs from rank 0 in ", items[i].first);
  if (!diff.empty())
    throw runtime::WorldConsistentError(
        cat("processes disagree ", when, " (", diff,
            "); every process must run the same model, data and options"));
}

// How many targets `truth` (a batch's labels or targets) holds: the denominator of the loss's
// mean and of the accuracy (the numerics contract: the loss is a sum, x 1 / the global batch's
// count). Targets: one per row. Labels: one per element ((N) per example, (N, T) per token),
// less those equal to the signature's ignore_index. A model computing its own loss: `rows`.
int64_t target_count(const graph::TrainingSignature& sig, const Tensor& truth, int64_t rows) {
  if (!sig.model_loss.empty()) return rows;
  OT_CHECK(truth.rank() >= 1 && truth.dims()[0] > 0, "train: empty batch");
  if (!sig.find_input(graph::InputRole::kLabels)) return truth.dims()[0];
  int64_t count = truth.numel();
  if (sig.ignore_index) {
    auto padding = [&](const auto* v) {
      return static_cast<int64_t>(std::count(v, v + truth.numel(), *sig.ignore_index));
    };
    if (truth.dtype() == graph::DataType::kInt64)
      count -= padding(truth.data_as<int64_t>());
    else if (truth.dtype() == graph::DataType::kInt32)
      count -= padding(truth.data_as<int32_t>());
    else
      fail("train: labels must be int64 or int32, not ", graph::dtype_short_name(truth.dtype()));
  }
  return count;
}

// A batch of padding alone gets 0 (no loss, no gradient). A model's own loss is a mean over
// each replica's rows: the step's loss is their mean over all `replicas`.
float loss_scale_of(const graph::TrainingSignature& sig, const Tensor& truth, int replicas) {
  if (!sig.model_loss.empty()) return 1.0f / static_cast<float>(replicas);
  const int64_t count = target_count(sig, truth, 0);
  return count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
}

}  // namespace

// --precision and --conv-algorithm against what the replicas' devices run. bf16 on a CPU
// without AVX512-BF16/AMX would run the reference loops (hundreds of times slower): refused
// unless --allow-emulation.
// fp16 (dynamic loss scaling) runs natively on no CPU this oneDNN supports. On GPUs the CUDA
// kernels run bf16 from compute capability 8.0 and fp16 from 7.0 (Device::runs_natively).
void check_precision(const ModelOptions& m,
                     const std::vector<std::shared_ptr<runtime::Device>>& devices) {
  const LossScalerOptions& ls = m.loss_scaler;
  OT_CHECK(ls.init > 0 && std::isfinite(ls.init) && std::exp2(std::round(std::log2(ls.init))) == ls.init,
           "--loss-scale must be a power of two (scaling by one is exact), got ", ls.init);
  OT_CHECK(ls.growth_interval >= 1, "--loss-scale-growth-interval must be >= 1, got ",
           ls.growth_interval);
  const LossScalerOptions defaults;
  OT_CHECK(m.precision == graph::DataType::kFloat16 ||
               (ls.init == defaults.init && ls.growth_interval == defaults.growth_interval),
           "--loss-scale and --loss-scale-growth-interval apply to --precision fp16 only (bf16 "
           "and fp32 need no loss scaling)");
  // --conv-algorithm picks oneDNN (CPU) kernels; cuDNN chooses its own algorithms per plan.
  for (const auto& d : devices)
    OT_CHECK(m.conv_algorithm == passes::ConvAlgorithm::kDirect ||
                 d->kind() == ops::DeviceKind::kCpu,
             "--conv-algorithm winograd on ", d->name(),
             ": it selects oneDNN's CPU kernels; on GPUs cuDNN chooses its own convolution "
             "algorithms (use --device cpu, or leave --conv-algorithm out)");
  if (m.precision == graph::DataType::kFloat || m.allow_emulation) return;
  for (const auto& d : devices) {
    const std::string why = runtime::precision_refusal(*d, m.precision);
    OT_CHECK(why.empty(), why);
  }
}

std::vector<std::shared_ptr<runtime::Device>> replica_devices(const ParallelOptions& p) {
  const std::string spec = p.device.empty() ? runtime::default_device_spec() : p.device;
  std::vector<std::shared_ptr<runtime::Device>> out;
  if (spec == "cuda") {
    const int gpus = runtime::cuda_device_count();
    OT_CHECK(runtime::cuda_built(),
             "--device cuda: this onnxtrain was built without the CUDA "
             "backend (use --device cpu)");
    const int first = p.local_rank * p.replicas;
    OT_CHECK(gpus >= first + p.replicas, "--device cuda: ", p.replicas, " replica",
             p.replicas == 1 ? "" : "s",
             p.local_rank > 0 ? cat(" of local process ", p.local_rank) : std::string(),
             " need GPU",
             p.replicas == 1 ? cat(" ", first) : cat("s ", first, "..", first + p.replicas - 1),
             ", this machine has ", gpus);
    for (int k = 0; k < p.replicas; ++k)
      out.push_back(runtime::make_device(cat("cuda:", first + k)));
  } else if (spec.rfind("cuda:", 0) == 0) {
    OT_CHECK(p.replicas == 1, "--device ", spec, " names one GPU; with --replicas ", p.replicas,
             " use --device cuda (replica k on GPU k)");
    out.push_back(runtime::make_device(spec));
  } else if (spec == "cpu" || spec == "sim") {
    // One device object per replica: "sim" (tests) keeps per-replica memory like GPUs do.
    for (int k = 0; k < p.replicas; ++k) out.push_back(runtime::make_device(spec));
  } else {
    fail("--device '", spec, "': expected cpu, cuda or cuda:N");
  }
  runtime::set_cuda_tf32(p.tf32);
  return out;
}

int default_threads(int local_processes) {
  int cpus = static_cast<int>(runtime::allowed_cpus().size());
  const int machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (cpus <= 0) cpus = machine;
  if (local_processes > 1 && cpus >= machine) cpus /= local_processes;
  return std::max(1, cpus);
}

Trainer::Trainer(const Options& opts) : opts_(opts) {
  // Custom ops first: the importer and everything after it look ops up in the registry.
  for (const std::string& lib : opts_.model.custom_op_libs) ops::load_op_library(lib);
  const std::string bytes = read_model_bytes(opts_.model.path);
  original_ = graph::import_onnx_bytes(bytes, opts_.model.path,
                                       fs::path(opts_.model.path).parent_path().string());
  model_hash_ = hex16(fnv1a64(bytes));
  build();
}

Trainer::Trainer(std::unique_ptr<graph::Model> model, const Options& opts)
    : opts_(opts), original_(std::move(model)) {
  build();
  start();
}

Trainer::~Trainer() = default;

// 16 hex digits from the OS's entropy: which checkpoints in a folder are this run's.
std::string new_run_id() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return hex16(v);
}

void Trainer::build() {
  if (run_id_.empty()) run_id_ = new_run_id();
  const ParallelOptions& p = opts_.parallel;
  OT_CHECK(p.replicas >= 1, "--replicas must be >= 1, got ", p.replicas);
  world_ = p.world && p.world->size() > 1 ? p.world : nullptr;
  schedule_ = runtime::parse_lr_schedule(opts_.schedule.lr_schedule, opts_.schedule.lr);
  const std::string& path = opts_.model.path.empty() ? std::string("model") : opts_.model.path;
  runtime::require_supported_ops(*original_, path);
  // Copies made here are part of the model the trained weights are written into.
  untie_ = passes::untie_initializers(*original_, opts_.model.trainable.untie_initializers);
  try {
    input_ = batch_input_of(*original_, path);
  } catch (const Error& e) {
    input_error_ = e.what();
  }
  model_inputs_ = model_inputs_of(*original_);
  devices_ = replica_devices(p);
  check_precision(opts_.model, devices_);
  // What the training labels are, when a file says (npy:, npz:): decides --loss auto (integer
  // labels: classes) and, unless --class-axis was given, where the classes are.
  std::optional<runtime::LabelFacts> labels;
  if (!opts_.data.train.empty()) {
    try {
      labels = runtime::label_facts(runtime::parse_data_spec(opts_.data.train), opts_.data.labels);
    } catch (const Error&) {
      // A malformed spec is reported when the data loads.
    }
  }
  // The typed inference model (once): the class axis below, the trained output's dims after
  // the training graph is built (replicated graphs rename the output).
  std::unique_ptr<graph::Model> typed = original_->clone();
  passes::infer_shapes(*typed);
  if (labels && labels->integer && opts_.model.class_axis_auto)
    opts_.model.class_axis = infer_class_axis(*typed, opts_.model.output, labels->example_dims);
  passes::TrainingOptions topts = graph_options(opts_);
  if (opts_.model.loss == passes::LossKind::kAuto && labels) topts.integer_labels = labels->integer;
  topts.replicas = p.replicas;
  // Placement for people reading the graph (partitions follow the recorded replica index).
  for (const auto& d : devices_) {
    topts.devices.push_back(d->name());
    // The CUDA kernels implement neither fuse_batchnorm_relu's marks nor block_layout's
    // (oneDNN's blocked layouts are CPU-only) nor ConvGrad's grad_dtype (kept weight copies)
    // nor FusedMatMul (fold_transposes).
    if (d->kind() == ops::DeviceKind::kCuda) {
      topts.fuse_batchnorm_relu = false;
      topts.fold_transposes = false;
      topts.block_layout = false;
      topts.keep_weight_copies = false;
      // Broadcast has no NCCL kernel.
      topts.shard_updates = false;
    }
  }
  topts.shard_updates = topts.shard_updates && p.shard_updates && world_ == nullptr;
  topts.bucket_mb = p.bucket_mb;
  topts.reduce_dtype = p.reduce_precision;
  topts.sync_batchnorm = p.sync_batchnorm;  // with 1 replica there is nothing to sync
  topts.collectives = world_ != nullptr;    // R == 1 too: the AllReduce spans the processes
  training_graph_ = original_->clone();
  info_ = passes::build_training_graph(*training_graph_, topts);
  if (training_graph_->training.find_input(graph::InputRole::kGradUnscale))
    scaler_ = LossScaler{.scale = opts_.model.loss_scaler.init};
  output_dims_ = output_dims(*typed, info_.prepared.logits);
  classes_ = cross_entropy() && !output_dims_.empty() ? output_dims_.back() : 0;
  threads_ = p.threads > 0 ? p.threads : default_threads(world_ ? p.local_processes : 1);
}

void Trainer::start() {
  if (session_) return;
  runtime::SessionOptions so;
  so.threads = threads_;
  so.profile_path = opts_.parallel.profile;
  so.replica_devices = devices_;
  session_ = std::make_unique<runtime::DataParallelSession>(
      passes::partition_replicas(*training_graph_), so, world_);
  // The sessions own the state now; a copy of the initial weights and optimizer moments in the
  // training graph would only take memory (issue #18: 293 MB for ResNet-50).
  graph::Graph& g = *training_graph_->graph;
  for (const graph::StateBinding& b : training_graph_->training.state)
    if (graph::Value* v = g.find_value(b.state); v && v->has_initializer()) g.clear_initializer(v);
  state_in_sessions_ = true;
}

const graph::Model& Trainer::training_graph() const {
  if (state_in_sessions_) {
    const std::map<std::string, Tensor> state = session().state();
    graph::Graph& g = *training_graph_->graph;
    // The current values, sharing the sessions' buffers until their next step writes them
    // (copy on write: from then on the graph holds a copy, as before issue #18).
    for (const graph::StateBinding& b : training_graph_->training.state)
      if (graph::Value* v = g.find_value(b.state)) g.set_initializer(v, state.at(b.original));
  }
  return *training_graph_;
}

const BatchInput& Trainer::batch_input() const {
  OT_CHECK(input_error_.empty(), input_error_);
  return input_;
}

runtime::DataParallelSession& Trainer::session() {
  OT_CHECK(session_, "train::Trainer: start() was not called");
  return *session_;
}
const runtime::DataParallelSession& Trainer::session() const {
  OT_CHECK(session_, "train::Trainer: start() was not called");
  return *session_;
}

runtime::StepResult Trainer::step(const std::map<std::string, Tensor>& batch, float lr,
                                  float loss_scale, uint64_t seed) {
  const graph::TrainingSignature& sig = training_graph_->training;
  if (loss_scale <= 0 && !sig.model_loss.empty()) {
    loss_scale = loss_scale_of(sig, Tensor(), opts_.parallel.replicas * processes());
  } else if (loss_scale <= 0) {
    const graph::InputBinding* truth = sig.find_input(graph::InputRole::kLabels);
    if (!truth) truth = sig.find_input(graph::InputRole::kTargets);
    auto it = truth ? batch.find(truth->name) : batch.end();
    OT_CHECK(it != batch.end() && it->second.rank() >= 1, "Trainer::step: the batch has no '",
             truth ? truth->name : "labels", "' (the training graph's labels or targets)");
    loss_scale = loss_scale_of(sig, it->second, 1);
  }
  return scaled_step(batch, lr, loss_scale, seed);
}

float Trainer::lr_at(int64_t s) const { return runtime::lr_at(schedule_, s); }

runtime::StepResult Trainer::scaled_step(const std::map<std::string, Tensor>& feeds, float lr,
                                         float loss_scale, uint64_t seed) {
  const double scale = scaler_.scale;
  runtime::StepResult r =
      session().step(feeds, lr, loss_scale, seed, scale > 0 ? static_cast<float>(scale) : 1.0f);
  scaler_.update(r.finite, opts_.model.loss_scaler.growth_interval);
  OT_CHECK(scaler_.scale <= 0 || scaler_.scale >= LossScaler::kMinScale, "--precision fp16: ",
           scaler_.skipped_in_row, " steps in a row overflowed float16 and the loss scale fell to ",
           scaler_.scale, ": the forward pass itself overflows float16 or its gradients exceed "
           "its range (use --precision bf16, which has float32's range)");
  return r;
}

int64_t Trainer::targets(const runtime::Batch& b) const {
  return target_count(training_graph_->training, b.targets, b.size());
}

std::map<std::string, Tensor> Trainer::model_feeds(runtime::Batch&& b) const {
  std::map<std::string, Tensor> feeds;
  if (!b.named.empty()) {
    for (auto& [name, t] : b.named) feeds[name] = std::move(t);
  } else {
    feeds[batch_input().name] = std::move(b.inputs);
  }
  return feeds;
}

runtime::StepResult Trainer::run_step(runtime::Batch b, int64_t s) {
  const graph::TrainingSignature& sig = training_graph_->training;
  const float loss_scale =  // of the global batch
      loss_scale_of(sig, b.targets, opts_.parallel.replicas * processes());
  const uint64_t step_seed =
      runtime::DataParallelSession::mix_seed(opts_.data.seed, static_cast<uint64_t>(s));
  return scaled_step(session_feeds(std::move(b)), lr_at(s), loss_scale,
                     step_seed);
}

void Trainer::prepare(const runtime::Batch& b) {
  session().prepare(session_feeds(b));
}

MemoryFacts Trainer::memory_facts() const {
  MemoryFacts m;
  const runtime::TrainingSession& r0 = session().replica_session(0);
  const runtime::PlanStats& p = r0.session().last_plan_stats();
  m.arena_bytes = p.arena_bytes;
  m.unshared_bytes = p.unshared_bytes;
  m.workspace_bytes = p.workspace_bytes;
  m.persistent_scratch_bytes = p.persistent_scratch_bytes;
  // Sharded updates (passes::shard_updates) leave each replica its own share of the optimizer
  // state: report the largest.
  for (int k = 0; k < session().replicas(); ++k) {
    int64_t bytes = 0;
    for (const auto& [name, t] : session().replica_session(k).all_state())
      bytes += static_cast<int64_t>(t.nbytes());
    m.state_bytes = std::max(m.state_bytes, bytes);
  }
  return m;
}

std::map<std::string, Tensor> Trainer::session_feeds(runtime::Batch b) const {
  const graph::TrainingSignature& sig = training_graph_->training;
  if (world_) {
    // This process's replicas p*R .. p*R+R-1 of the global split; its ShardBatch nodes then
    // split these rows over R by the same rule, which reproduces the global split.
    const int r = opts_.parallel.replicas;
    const auto [start, rows] =
        runtime::shard_range(b.size(), r * world_->size(), world_->rank() * r, r);
    b = b.rows(start, rows);
  }
  Tensor truth = std::move(b.targets);
  std::map<std::string, Tensor> feeds = model_feeds(std::move(b));
  if (sig.model_loss.empty())
    feeds[input_named(sig, cross_entropy() ? graph::InputRole::kLabels
                                           : graph::InputRole::kTargets)] = std::move(truth);
  return feeds;
}

TrainingData Trainer::load_data() const {
  const DataOptions& d = opts_.data;
  runtime::DataConfig dc{d.train, d.val, d.val_split, d.seed};
  runtime::LoadOptions lo;
  if (input_error_.empty()) lo.model_input = input_.dims;
  lo.num_classes = classes_;
  lo.seed = d.seed;
  lo.padding_label = opts_.model.ignore_index;
  lo.inputs = model_inputs_;
  lo.labels_name = info_.loss.kind == passes::LossKind::kOutput ? "" : d.labels;
  // Labels of one example for logits (N, C, d1...) or, classes last, (N, d1..., C).
  std::vector<int64_t> label_dims;
  if (cross_entropy() && output_dims_.size() >= 2) {
    label_dims = output_dims_;
    label_dims.erase(opts_.model.class_axis == 1 ? label_dims.begin() : label_dims.end() - 1);
    lo.label_dims = label_dims;
  }
  // A dataset of examples (images, features) feeds one float input; say so before reading it.
  for (const std::string& spec_text : {d.train, d.val}) {
    if (spec_text.empty() || spec_text == "none") continue;
    const runtime::DataSpec spec = runtime::parse_data_spec(spec_text);
    if (spec.named() || spec.kind == runtime::DataSpec::Kind::kSynthetic) continue;
    const bool one_input = model_inputs_.size() == 1 &&
                           (model_inputs_[0].dtype == graph::DataType::kFloat ||
                            spec.kind == runtime::DataSpec::Kind::kNpy);
    if (one_input) continue;
    std::string names;
    for (const runtime::ModelInput& in : model_inputs_)
      names += cat(names.empty() ? "" : ", ", "'", in.name, "' ", graph::dtype_short_name(in.dtype));
    fail(spec_text, ": feeds one float input, the model has ", names,
         "; give --data npz:FILE with one array per input and 'labels' (or npy:NAME=FILE,...)");
  }
  runtime::TrainValData sets = runtime::load_train_val(dc, lo);
  const std::string& out = info_.prepared.logits;
  for (const runtime::Dataset* set : {&sets.train, sets.val ? &*sets.val : nullptr}) {
    if (!set) continue;
    if (!set->is_named()) batch_input();  // the one input a dataset of examples feeds
    if (info_.loss.kind == passes::LossKind::kOutput) {
      continue;  // the model computes its loss from its own inputs
    } else if (cross_entropy()) {
      OT_CHECK(set->has_labels(), set->name(), ": has float targets but the loss is ",
               "cross-entropy on '", out, "' (give --loss mse)");
      set->check_labels(classes_);
      if (!output_dims_.empty() && set->label_shape() != label_dims) {
        std::string got = "(N", want = "(N";
        for (int64_t x : set->label_shape()) got += cat(",", x);
        for (int64_t x : label_dims) want += cat(",", x);
        fail(set->name(), ": labels of shape ", got, ") do not fit output '", out,
             "', which wants labels ", want, ") with --class-axis ", opts_.model.class_axis,
             opts_.model.class_axis == 1 ? " (classes last, e.g. per-token logits (N,T,C) with "
                                           "labels (N,T), need --class-axis -1)"
                                         : "");
      }
    } else {
      OT_CHECK(!set->has_labels(), set->name(), ": has class labels but the loss is mse on '", out,
               "' (give --loss cross-entropy, or float targets)");
      OT_CHECK(output_dims_.empty() || set->target_shape() == output_dims_, set->name(),
               ": target shape does not match output '", out, "'");
    }
  }
  runtime::InputAdapter adapter =
      runtime::InputAdapter::for_dataset(sets.train, lo.model_input, d.normalization);
  std::optional<runtime::InputAdapter> val_adapter;
  if (sets.val)
    val_adapter = runtime::InputAdapter::for_dataset(*sets.val, lo.model_input, d.normalization);
  return TrainingData{std::move(sets), std::move(adapter), std::move(val_adapter)};
}

const RunLength& Trainer::plan_length(int64_t train_examples) {
  const int all_replicas = opts_.parallel.replicas * processes();
  const DataOptions& d = opts_.data;
  RunLength& l = length_;
  l.train_examples = train_examples;
  l.global_batch = d.global_batch > 0 ? d.global_batch : d.batch_size * all_replicas;
  OT_CHECK(l.global_batch >= all_replicas, "--global-batch-size ", l.global_batch,
           " is smaller than the ", all_replicas, " replicas of ", processes(), " processes");
  l.steps_per_epoch = runtime::steps_per_epoch(train_examples, l.global_batch);
  l.total_steps =
      opts_.schedule.steps > 0 ? opts_.schedule.steps : opts_.schedule.epochs * l.steps_per_epoch;
  l.epochs = (l.total_steps + l.steps_per_epoch - 1) / l.steps_per_epoch;
  if (schedule_.kind == runtime::LrSchedule::Kind::kCosine && schedule_.total_steps == 0)
    schedule_.total_steps = l.total_steps;
  return l;
}

// The evaluation graph's loss and correct outputs are summed over the validation set; its
// state inputs are fed the current training state (by single-replica name).
EvalResult Trainer::evaluate(const runtime::Dataset& val, const runtime::InputAdapter& adapter,
                             int64_t batch) {
  std::map<std::string, Tensor> state = session().state();
  if (!eval_session_) {
    runtime::SessionOptions vo;
    vo.threads = threads_;
    vo.device = devices_.front();  // replica 0's device (idle while evaluation runs)
    std::vector<std::string> names;
    for (const auto& [name, t] : state) names.push_back(name);
    eval_session_ = std::make_unique<runtime::InferenceSession>(
        passes::build_evaluation_graph(*original_, graph_options(opts_), info_.loss.kind, names),
        vo);
  }
  runtime::InferenceSession& s = *eval_session_;
  const graph::TrainingSignature& sig = s.model().training;
  std::map<std::string, Tensor> feeds;
  for (const graph::InputBinding* b : sig.inputs_with(graph::InputRole::kState))
    feeds[b->name] = state.at(b->name);
  feeds[input_named(sig, graph::InputRole::kLossScale)] =
      Tensor::from_vector(graph::DataType::kFloat, {}, std::vector<float>{1.0f});
  const bool model_loss = !sig.model_loss.empty();
  const std::string truth_name =
      model_loss ? std::string()
                 : input_named(sig, cross_entropy() ? graph::InputRole::kLabels
                                                    : graph::InputRole::kTargets);
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
  lo.seed = opts_.data.seed;
  lo.images = image_stream(false);
  // With several processes each evaluates every P-th batch (rank p: batches p, p + P, ...) and
  // the sums are added over the processes: validation takes 1/P of the time on every rank and
  // no rank waits for another's (the collective timeout never covers a whole validation). The
  // other processes' batches are never built (no copies, no image decoding): the loader hands
  // them out empty and the loop below skips them.
  const int64_t procs = world_ ? world_->size() : 1, me = world_ ? world_->rank() : 0;
  runtime::BatchFn make = runtime::dataset_batch_fn(val, adapter, lo.seed, lo.images);
  if (procs > 1)
    make = [make = std::move(make), procs, me](std::span<const int64_t> indices,
                                               runtime::Batch& out) {
      if (out.step % procs == me) make(indices, out);
    };
  runtime::DataLoader loader(val.size(), std::move(make), lo);
  double loss_sum = 0, correct = 0, count = 0;
  for (int64_t i = 0; i < loader.steps_per_epoch(); ++i) {
    runtime::Batch b = loader.next();
    if (i % procs != me) continue;
    const int64_t rows = b.size();
    const auto targets = static_cast<double>(target_count(sig, b.targets, rows));
    count += targets;
    Tensor truth = std::move(b.targets);
    for (auto& [name, t] : model_feeds(std::move(b))) feeds[name] = std::move(t);
    if (!model_loss) feeds[truth_name] = std::move(truth);
    std::vector<Tensor> r = s.run(feeds);
    // A model's own loss is its batch's mean: weigh it by the rows.
    loss_sum += static_cast<double>(r[loss_at].data_as<float>()[0]) * (model_loss ? targets : 1.0);
    if (correct_at >= 0) correct += static_cast<double>(r[correct_at].data_as<float>()[0]);
  }
  if (world_) {
    double sums[3] = {loss_sum, correct, count};
    world_->all_reduce(sums, 3, graph::DataType::kDouble, "validation");
    loss_sum = sums[0];
    correct = sums[1];
    count = sums[2];
  }
  EvalResult out;
  const double n = std::max(count, 1.0);  // targets (rows, or counted labels)
  out.loss = loss_sum / n;
  if (cross_entropy() && correct_at >= 0) out.accuracy = correct / n;
  return out;
}

runtime::ImageStreamOptions Trainer::image_stream(bool training) const {
  runtime::ImageStreamOptions io;
  io.augment = training ? opts_.data.augment : runtime::Augment::kNone;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  io.workers = opts_.data.data_workers > 0 ? opts_.data.data_workers
                                           : std::max(1, cores - threads_);
  io.on_bad_image = opts_.data.on_bad_image;
  if (lead())
    io.warn = [](const std::string& message) {
      std::fprintf(stderr, "onnxtrain: warning: %s\n", message.c_str());
    };
  return io;
}

void Trainer::set_fill(runtime::LoaderOptions& lo) const {
  if (!world_) return;
  // The rows session_feeds keeps: this process's replicas of the global split.
  const int r = opts_.parallel.replicas;
  lo.fill_parts = r * world_->size();
  lo.fill_first = world_->rank() * r;
  lo.fill_count = r;
}

RunIdentity Trainer::identity() const {
  const DataOptions& d = opts_.data;
  RunIdentity id;
  // A model handed over in memory is hashed as exported (only checkpoints need it).
  id.model_hash =
      model_hash_.empty() ? hex16(fnv1a64(graph::export_onnx_bytes(*original_))) : model_hash_;
  id.optimizer = opts_.optimizer.kind;
  id.momentum = opts_.optimizer.momentum;
  id.nesterov = opts_.optimizer.nesterov;
  id.weight_decay = opts_.optimizer.weight_decay;
  id.clip_norm = opts_.optimizer.clip_global_norm;
  id.lr = opts_.schedule.lr;
  id.schedule_kind = schedule_.kind;
  id.schedule = opts_.schedule.lr_schedule;
  id.global_batch = length_.global_batch;
  id.replicas = opts_.parallel.replicas;
  id.processes = processes();
  id.seed = d.seed;
  id.data = d.train;
  if (d.labels != "labels") id.data += cat(" (labels '", d.labels, "')");
  id.val_split = d.val_split;
  id.normalization = "default";
  if (d.normalization) {
    id.normalization = "mean=";
    for (float x : d.normalization->mean) id.normalization += cat(x, ",");
    id.normalization += " std=";
    for (float x : d.normalization->std) id.normalization += cat(x, ",");
  }
  id.loss = opts_.model.loss;
  id.class_axis = opts_.model.class_axis;
  id.ignore_index = opts_.model.ignore_index;
  id.output_name = opts_.model.output;
  id.freeze = opts_.model.trainable.freeze_regex;
  id.trainable = opts_.model.trainable.trainable_regex;
  id.sync_batchnorm = opts_.parallel.sync_batchnorm && opts_.parallel.replicas * processes() > 1;
  id.bn_frozen = opts_.model.trainable.freeze_batch_norm;
  id.untie = opts_.model.trainable.untie_initializers;
  id.precision = opts_.model.precision;
  // As sync_batchnorm: the wire dtype changes the math only when something is reduced.
  id.reduce_precision = opts_.parallel.replicas * processes() > 1 ? opts_.parallel.reduce_precision
                                                                   : graph::DataType::kFloat;
  return id;
}

void Trainer::save_checkpoint(const RunPosition& position) const {
  if (!lead()) return;
  const std::string& dir = opts_.checkpoint.dir;
  runtime::Checkpoint ck;
  RunPosition at = position;
  at.loss_scale = scaler_.scale;
  at.loss_scale_clean_steps = scaler_.clean_steps;
  ck.metadata = to_metadata(CheckpointState{identity(), at});
  ck.metadata[runtime::kRunIdKey] = run_id_;
  for (auto& [name, t] : session().state()) {
    // A non-finite state is never written: the older checkpoints stay, none is pruned.
    if (auto bad = runtime::find_nonfinite(t))
      fail("checkpoint of step ", position.step, " not written: '", name,
           "' is not finite (element ", bad->index, " is ", runtime::nonfinite_text(bad->value),
           ")");
    ck.add_tensor(name, std::move(t));
  }
  const fs::path file = fs::path(dir) / runtime::checkpoint_file_name(position.step);
  runtime::write_checkpoint(file.string(), ck);
  runtime::prune_checkpoints(dir, run_id_, kKeepCheckpoints);
}

RunPosition Trainer::resume() {
  RunPosition pos;
  const std::string& dir = opts_.checkpoint.dir;
  if (lead()) {
    std::vector<std::string> skipped;
    std::optional<runtime::LoadedCheckpoint> got = runtime::load_latest_checkpoint(dir, &skipped);
    OT_CHECK(got, "--resume: no readable checkpoint (ckpt-<step>.otck) in '", dir, "'",
             skipped.empty() ? std::string() : cat(" (skipped: ", skipped.front(), ")"));
    for (const std::string& why : skipped)
      std::fprintf(stderr, "onnxtrain: warning: --resume: skipping a newer checkpoint that does "
                           "not read back (left in place): %s\n", why.c_str());
    const runtime::Checkpoint& ck = got->ckpt;
    const std::string& path = got->file.path;
    auto id = ck.metadata.find(runtime::kRunIdKey);
    if (id != ck.metadata.end() && !id->second.empty()) run_id_ = id->second;
    const CheckpointState saved = from_metadata(ck.metadata, path);
    const RunIdentity now = identity();
    if (!(saved.identity == now)) {
      const std::string diff = identity_difference(saved.identity, now);
      fail("--resume: ", path, " was written with different options (",
           diff.empty() ? "options" : diff,
           "); resume with the original options or use a new --checkpoint-dir");
    }
    OT_CHECK(saved.position.steps_per_epoch == length_.steps_per_epoch, path, ": written at ",
             saved.position.steps_per_epoch, " steps per epoch, this run has ",
             length_.steps_per_epoch);
    std::map<std::string, Tensor> state = session().state();
    for (auto& [name, t] : state) {
      const Tensor* tensor = ck.find_tensor(name);
      OT_CHECK(tensor, path, ": no tensor '", name, "' (the training graph's state)");
      t = *tensor;
    }
    session().set_state(state);
    remove_stale_temporaries(dir);
    pos = saved.position;
  }
  if (world_) {
    // Rank 0 read the checkpoint; the others get its state and position.
    int64_t ints[6] = {pos.step, pos.steps_per_epoch, pos.epoch_examples, pos.epoch_steps,
                       pos.epoch_targets, pos.loss_scale_clean_steps};
    double reals[4] = {pos.epoch_loss_sum, pos.epoch_correct, pos.epoch_seconds, pos.loss_scale};
    world_->broadcast(ints, 6, graph::DataType::kInt64, 0, "resume position");
    world_->broadcast(reals, 4, graph::DataType::kDouble, 0, "resume position");
    pos = RunPosition{.step = ints[0],
                      .steps_per_epoch = ints[1],
                      .epoch_loss_sum = reals[0],
                      .epoch_correct = reals[1],
                      .epoch_seconds = reals[2],
                      .epoch_examples = ints[2],
                      .epoch_steps = ints[3],
                      .epoch_targets = ints[4],
                      .loss_scale = reals[3],
                      .loss_scale_clean_steps = ints[5]};
    std::map<std::string, Tensor> state = session().state();
    for (auto& [name, t] : state)
      world_->broadcast(t.mutable_data(), static_cast<int64_t>(t.nbytes()), graph::DataType::kUInt8,
                        0, "resume state");
    session().set_state(state);
  }
  // The precision is part of the identity: an fp16 checkpoint resumes an fp16 run.
  if (scaler_.scale > 0 && pos.loss_scale > 0)
    scaler_ = LossScaler{.scale = pos.loss_scale, .clean_steps = pos.loss_scale_clean_steps};
  return pos;
}

void Trainer::check_setup(bool resume) const {
  if (!world_) return;
  std::vector<std::pair<std::string, std::string>> setup = identity_fields(identity());
  std::string buckets;
  for (size_t b = 0; b < info_.buckets.num_buckets(); ++b) {
    buckets += cat(info_.buckets.bytes[b], ":");
    for (const std::string& p : info_.buckets.params[b]) buckets += p + ",";
    buckets += ";";
  }
  setup.emplace_back("training graph", cat(fnv1a64(graph::export_onnx_bytes(*training_graph_))));
  setup.emplace_back("bucket layout", buckets);
  setup.emplace_back("steps", cat(length_.total_steps, " of ", length_.steps_per_epoch,
                                  " per epoch, ", length_.train_examples, " examples"));
  setup.emplace_back("resume", resume ? "1" : "0");
  setup.emplace_back("MPI reduction algorithm", world_->reduction_algorithm());
  // Each adds collectives of its own: every process must take part in the same ones.
  setup.emplace_back("--verify-ranks", opts_.parallel.verify_ranks ? "1" : "0");
  check_same(*world_, setup, "before step 1");
}

void Trainer::check_weights_agree(const std::string& when) const {
  if (!world_) return;
  // The collectives give every replica of every process the same bytes; verify it.
  OT_CHECK(session().replicas_identical(), "rank ", world_->rank(),
           ": the replicas of this process ended with different weights");
  uint64_t h = fnv1a64("state");
  for (const auto& [name, t] : session().state())
    h = fnv1a64(std::string_view(reinterpret_cast<const char*>(t.data()), t.nbytes()),
                fnv1a64(name, h));
  check_same(*world_, {{"trained weights", cat(h)}}, when);
}

void Trainer::export_model(const std::string& path) const {
  std::unique_ptr<graph::Model> m = trained_model();
  for (const graph::Value* v : m->graph->initializers())
    if (auto bad = runtime::find_nonfinite(v->initializer()))
      fail(path, ": not written: weight '", v->name(), "' is not finite (element ", bad->index,
           " is ", runtime::nonfinite_text(bad->value), ")");
  graph::export_onnx_file(*m, path);
}

std::string Trainer::nonfinite_state() const {
  for (const auto& [name, t] : session().state())
    if (auto bad = runtime::find_nonfinite(t))
      return cat("'", name, "' (element ", bad->index, " is ", runtime::nonfinite_text(bad->value),
                 ")");
  return "";
}

std::string Trainer::diagnose_nonfinite(const runtime::Batch& batch) const {
  constexpr int64_t kMaxRows = 256;
  // The rows that have inputs (this process's, under MPI with a fill range), at most kMaxRows.
  const auto [fill_begin, fill_end] = batch.filled();
  runtime::Batch b = batch.rows(fill_begin, std::min(kMaxRows, fill_end - fill_begin));
  std::map<std::string, Tensor> feeds = model_feeds(std::move(b));
  for (const auto& [name, t] : feeds)
    if (auto bad = runtime::find_nonfinite(t)) {
      const int64_t per_row = t.dims().empty() || t.dims()[0] == 0 ? 1 : t.numel() / t.dims()[0];
      return cat("model input '", name, "' of the batch (row ", bad->index / per_row, " is ",
                 runtime::nonfinite_text(bad->value), ")");
    }
  std::unique_ptr<graph::Model> m = trained_model();
  for (const graph::Value* v : m->graph->initializers())
    if (auto bad = runtime::find_nonfinite(v->initializer()))
      return cat("weight '", v->name(), "' (element ", bad->index, " is ",
                 runtime::nonfinite_text(bad->value), ")");
  passes::lower_sequences(*m);
  // Every float value a node makes becomes a graph output, in graph order, so none is reused.
  graph::Graph& g = *m->graph;
  std::vector<std::string> what;  // per graph output: "node 'n' (Op) output 'v'"
  std::set<const graph::Value*> outputs(g.outputs().begin(), g.outputs().end());
  std::map<const graph::Value*, size_t> order;
  std::vector<graph::Value*> added;
  for (graph::Node* n : g.topological_order())
    for (graph::Value* o : n->outputs()) {
      if (!o) continue;
      order[o] = order.size();
      if (!outputs.count(o) && graph::is_float_dtype(o->type.dtype)) added.push_back(o);
    }
  for (graph::Value* o : added) g.add_output(o);
  std::vector<std::pair<size_t, std::string>> named;  // (graph order, description) per output
  for (const graph::Value* o : g.outputs()) {
    const graph::Node* n = o->producer();
    named.emplace_back(order.count(o) ? order[o] : 0,
                       n ? cat("node '", n->name, "' (", n->op_type, ") output '", o->name(), "'")
                         : cat("graph output '", o->name(), "'"));
  }
  runtime::SessionOptions so;
  so.threads = threads_;
  runtime::InferenceSession session(std::move(m), so);
  std::vector<Tensor> got = session.run(feeds);
  size_t first = named.size();
  std::string text;
  for (size_t i = 0; i < got.size() && i < named.size(); ++i)
    if (auto bad = runtime::find_nonfinite(got[i]); bad && (first == named.size() ||
                                                             named[i].first < named[first].first)) {
      first = i;
      text = cat(named[i].second, " (element ", bad->index, " is ",
                 runtime::nonfinite_text(bad->value), ")");
    }
  return text;
}

int64_t Trainer::trainable_parameters() const {
  int64_t n = 0;
  for (const std::string& p : info_.prepared.params) {
    const graph::Value* v = original_->graph->find_value(p);
    if (v && v->has_initializer()) n += v->initializer().numel();
  }
  return n;
}

int64_t Trainer::allreduce_bytes() const {
  int64_t n = 0;
  for (const std::string& p : info_.prepared.params) {
    const graph::Value* v = original_->graph->find_value(p);
    if (v && v->has_initializer()) n += static_cast<int64_t>(v->initializer().nbytes());
  }
  // --reduce-precision bf16: float32 gradients travel as bfloat16.
  return opts_.parallel.reduce_precision == graph::DataType::kBFloat16 ? n / 2 : n;
}

std::string Trainer::devices_text() const {
  std::string out;
  for (const auto& d : devices_) {
    if (d->name() == "cpu") return "cpu";
    out += (out.empty() ? "" : ", ") + d->name();
  }
  return out;
}

}  // namespace onnxtrain::train
