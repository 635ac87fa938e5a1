// The checkpoint state's serializer (checkpoint_state.h) and the enums' name tables.
#include "train/checkpoint_state.h"

#include <array>
#include <charconv>
#include <cmath>
#include <system_error>

#include "graph/error.h"

namespace onnxtrain::train {
namespace {

template <typename E>
struct Named {
  E value;
  std::string_view name;
};

// One table per enum: the name of a value and the value of a name both come from it.
constexpr std::array<Named<passes::OptimizerKind>, 5> kOptimizers{{
    {passes::OptimizerKind::kSgd, "sgd"},
    {passes::OptimizerKind::kMomentum, "momentum"},
    {passes::OptimizerKind::kAdam, "adam"},
    {passes::OptimizerKind::kAdamW, "adamw"},
    {passes::OptimizerKind::kAdagrad, "adagrad"},
}};
constexpr std::array<Named<passes::LossKind>, 4> kLosses{{
    {passes::LossKind::kAuto, "auto"},
    {passes::LossKind::kCrossEntropy, "cross-entropy"},
    {passes::LossKind::kMse, "mse"},
    {passes::LossKind::kOutput, "output"},
}};
constexpr std::array<Named<runtime::LrSchedule::Kind>, 3> kSchedules{{
    {runtime::LrSchedule::Kind::kConstant, "constant"},
    {runtime::LrSchedule::Kind::kStep, "step"},
    {runtime::LrSchedule::Kind::kCosine, "cosine"},
}};

template <typename E, size_t N>
std::string_view name_in(const std::array<Named<E>, N>& table, E v) {
  for (const auto& e : table)
    if (e.value == v) return e.name;
  return "?";
}

template <typename E, size_t N>
std::optional<E> value_in(const std::array<Named<E>, N>& table, std::string_view name) {
  for (const auto& e : table)
    if (e.name == name) return e.value;
  return std::nullopt;
}

template <typename E, size_t N>
std::string names_in(const std::array<Named<E>, N>& table) {
  std::string out;
  for (size_t i = 0; i < N; ++i)
    out += cat(i == 0 ? "" : i + 1 == N ? " or " : ", ", table[i].name);
  return out;
}

// Shortest text that reads back to the same bits.
template <typename T>
std::string exact(T v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, end);
}

const char* yes_no(bool b) {
  return b ? "true" : "false";
}

// Reads fields of one checkpoint's metadata; every error names the file and the field.
class Reader {
 public:
  Reader(const std::map<std::string, std::string>& m, const std::string& file)
      : m_(m), file_(file) {}

  const std::string& text(const std::string& key) const {
    auto it = m_.find(key);
    OT_CHECK(it != m_.end(), file_, ": checkpoint field '", key, "' is missing");
    return it->second;
  }
  template <typename T>
  T number(const std::string& key) const {
    const std::string& s = text(key);
    T v{};
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    OT_CHECK(!s.empty() && ec == std::errc() && ptr == s.data() + s.size(), file_,
             ": checkpoint field '", key, "' is not a number: '", s, "'");
    return v;
  }
  bool boolean(const std::string& key) const {
    const std::string& s = text(key);
    OT_CHECK(s == "true" || s == "false", file_, ": checkpoint field '", key,
             "' is not true or false: '", s, "'");
    return s == "true";
  }
  template <typename E, size_t N>
  E named(const std::string& key, const std::array<Named<E>, N>& table, const char* what) const {
    const std::string& s = text(key);
    std::optional<E> v = value_in(table, s);
    OT_CHECK(v, file_, ": checkpoint field '", key, "': unknown ", what, " '", s, "' (expected ",
             names_in(table), ")");
    return *v;
  }

 private:
  const std::map<std::string, std::string>& m_;
  const std::string& file_;
};

constexpr const char* kIdentityPrefix = "opt.";

}  // namespace

std::string_view optimizer_kind_name(passes::OptimizerKind k) {
  return name_in(kOptimizers, k);
}
std::optional<passes::OptimizerKind> optimizer_kind_from_name(std::string_view name) {
  return value_in(kOptimizers, name);
}
std::string optimizer_kind_names() {
  return names_in(kOptimizers);
}
std::string_view loss_kind_name(passes::LossKind k) {
  return name_in(kLosses, k);
}
std::optional<passes::LossKind> loss_kind_from_name(std::string_view name) {
  return value_in(kLosses, name);
}
std::string loss_kind_names() {
  return names_in(kLosses);
}
std::string_view schedule_kind_name(runtime::LrSchedule::Kind k) {
  return name_in(kSchedules, k);
}
std::optional<runtime::LrSchedule::Kind> schedule_kind_from_name(std::string_view name) {
  return value_in(kSchedules, name);
}
std::string schedule_kind_names() {
  return names_in(kSchedules);
}

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::vector<std::pair<std::string, std::string>> identity_fields(const RunIdentity& id) {
  return {
      {"model", id.model_hash},
      {"optimizer", std::string(optimizer_kind_name(id.optimizer))},
      {"momentum", exact(id.momentum)},
      {"nesterov", yes_no(id.nesterov)},
      {"weight_decay", exact(id.weight_decay)},
      {"clip_norm", exact(id.clip_norm)},
      {"lr", exact(id.lr)},
      {"lr_schedule_kind", std::string(schedule_kind_name(id.schedule_kind))},
      {"lr_schedule", id.schedule},
      {"global_batch", std::to_string(id.global_batch)},
      {"replicas", std::to_string(id.replicas)},
      {"processes", std::to_string(id.processes)},
      {"seed", std::to_string(id.seed)},
      {"data", id.data},
      {"val_split", exact(id.val_split)},
      {"normalization", id.normalization},
      {"loss", std::string(loss_kind_name(id.loss))},
      {"class_axis", std::to_string(id.class_axis)},
      {"ignore_index", id.ignore_index ? std::to_string(*id.ignore_index) : "none"},
      {"output_name", id.output_name},
      {"freeze", id.freeze},
      {"trainable", id.trainable},
      {"sync_batchnorm", yes_no(id.sync_batchnorm)},
      {"bn_mode", id.bn_frozen ? "frozen" : "train"},
      {"untie_initializers", yes_no(id.untie)},
      {"precision", precision_name(id.precision)},
      {"reduce_precision", precision_name(id.reduce_precision)},
  };
}

std::string identity_difference(const RunIdentity& was, const RunIdentity& now) {
  const auto a = identity_fields(was), b = identity_fields(now);
  std::string diff;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].second != b[i].second)
      diff +=
          cat(diff.empty() ? "" : ", ", a[i].first, " '", a[i].second, "' -> '", b[i].second, "'");
  return diff;
}

std::map<std::string, std::string> to_metadata(const CheckpointState& s) {
  std::map<std::string, std::string> m;
  m["format"] = std::string(kCheckpointFormat);
  for (auto& [k, v] : identity_fields(s.identity)) m[kIdentityPrefix + k] = std::move(v);
  const RunPosition& p = s.position;
  m["step"] = std::to_string(p.step);
  m["steps_per_epoch"] = std::to_string(p.steps_per_epoch);
  // The shuffle order is a pure function of (seed, epoch) and the step's random seed (Dropout)
  // one of (seed, step): the seed (in the identity) and the step are the whole RNG state.
  m["epoch_loss_sum"] = exact(p.epoch_loss_sum);
  m["epoch_correct"] = exact(p.epoch_correct);
  m["epoch_seconds"] = exact(p.epoch_seconds);
  m["epoch_examples"] = std::to_string(p.epoch_examples);
  m["epoch_steps"] = std::to_string(p.epoch_steps);
  m["epoch_targets"] = std::to_string(p.epoch_targets);
  if (p.loss_scale > 0) {
    m["loss_scale"] = exact(p.loss_scale);
    m["loss_scale_clean_steps"] = std::to_string(p.loss_scale_clean_steps);
  }
  return m;
}

CheckpointState from_metadata(const std::map<std::string, std::string>& metadata,
                              const std::string& file) {
  auto format = metadata.find("format");
  OT_CHECK(format != metadata.end() && format->second.starts_with("onnxtrain-checkpoint/"), file,
           ": not an onnxtrain training checkpoint (no 'format' field naming an "
           "onnxtrain-checkpoint version)");
  OT_CHECK(format->second == kCheckpointFormat, file, ": checkpoint field 'format' is '",
           format->second, "', this onnxtrain reads '", kCheckpointFormat,
           "' only (start again with a new --checkpoint-dir)");
  const Reader r(metadata, file);
  auto opt = [](const char* k) { return std::string(kIdentityPrefix) + k; };
  CheckpointState s;
  RunIdentity& id = s.identity;
  id.model_hash = r.text(opt("model"));
  id.optimizer = r.named(opt("optimizer"), kOptimizers, "optimizer");
  id.momentum = r.number<float>(opt("momentum"));
  id.nesterov = r.boolean(opt("nesterov"));
  id.weight_decay = r.number<float>(opt("weight_decay"));
  id.clip_norm = r.number<float>(opt("clip_norm"));
  id.lr = r.number<float>(opt("lr"));
  id.schedule_kind = r.named(opt("lr_schedule_kind"), kSchedules, "learning-rate schedule");
  id.schedule = r.text(opt("lr_schedule"));
  id.global_batch = r.number<int64_t>(opt("global_batch"));
  id.replicas = r.number<int>(opt("replicas"));
  id.processes = r.number<int>(opt("processes"));
  id.seed = r.number<uint64_t>(opt("seed"));
  id.data = r.text(opt("data"));
  id.val_split = r.number<double>(opt("val_split"));
  id.normalization = r.text(opt("normalization"));
  id.loss = r.named(opt("loss"), kLosses, "loss");
  id.class_axis = r.number<int64_t>(opt("class_axis"));
  if (r.text(opt("ignore_index")) != "none") id.ignore_index = r.number<int64_t>(opt("ignore_index"));
  id.output_name = r.text(opt("output_name"));
  id.freeze = r.text(opt("freeze"));
  id.trainable = r.text(opt("trainable"));
  id.sync_batchnorm = r.boolean(opt("sync_batchnorm"));
  // Written since --bn-mode exists; an older checkpoint trained BN in train mode.
  const std::string bn_mode =
      metadata.count(opt("bn_mode")) ? r.text(opt("bn_mode")) : std::string("train");
  OT_CHECK(bn_mode == "train" || bn_mode == "frozen", file, ": field '", opt("bn_mode"),
           "': expected train or frozen, got '", bn_mode, "'");
  id.bn_frozen = bn_mode == "frozen";
  id.untie = metadata.count(opt("untie_initializers")) && r.boolean(opt("untie_initializers"));
  // Written since --precision exists; an older checkpoint trained in float32.
  if (metadata.count(opt("precision"))) {
    const std::string name = r.text(opt("precision"));
    const std::optional<graph::DataType> t = parse_precision(name);
    OT_CHECK(t, file, ": field '", opt("precision"), "': expected fp32, bf16 or fp16, got '", name,
             "'");
    id.precision = *t;
  }
  // Written since --reduce-precision exists; an older checkpoint reduced in float32.
  if (metadata.count(opt("reduce_precision"))) {
    const std::string name = r.text(opt("reduce_precision"));
    const std::optional<graph::DataType> t = parse_precision(name);
    OT_CHECK(t == graph::DataType::kFloat || t == graph::DataType::kBFloat16, file, ": field '",
             opt("reduce_precision"), "': expected fp32 or bf16, got '", name, "'");
    id.reduce_precision = *t;
  }
  RunPosition& p = s.position;
  p.step = r.number<int64_t>("step");
  p.steps_per_epoch = r.number<int64_t>("steps_per_epoch");
  OT_CHECK(p.step >= 0 && p.steps_per_epoch >= 1, file, ": checkpoint field 'step' (", p.step,
           ") or 'steps_per_epoch' (", p.steps_per_epoch, ") is out of range");
  p.epoch_loss_sum = r.number<double>("epoch_loss_sum");
  p.epoch_correct = r.number<double>("epoch_correct");
  p.epoch_seconds = r.number<double>("epoch_seconds");
  p.epoch_examples = r.number<int64_t>("epoch_examples");
  p.epoch_targets = r.number<int64_t>("epoch_targets");
  p.epoch_steps = r.number<int64_t>("epoch_steps");
  // Written by fp16 runs (dynamic loss scaling) only.
  if (metadata.count("loss_scale")) {
    p.loss_scale = r.number<double>("loss_scale");
    p.loss_scale_clean_steps = r.number<int64_t>("loss_scale_clean_steps");
    OT_CHECK(p.loss_scale > 0 && std::isfinite(p.loss_scale) && p.loss_scale_clean_steps >= 0,
             file, ": checkpoint field 'loss_scale' (", p.loss_scale,
             ") or 'loss_scale_clean_steps' (", p.loss_scale_clean_steps, ") is out of range");
  }
  return s;
}

}  // namespace onnxtrain::train
