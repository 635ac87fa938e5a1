// TrainingSession (training_session.h).
#include "runtime/training_session.h"

#include "graph/error.h"
#include "graph/printer.h"

namespace onnxtrain::runtime {
namespace {

constexpr const char* kUpdated = ".updated";

double scalar_of(const graph::Tensor& t, const std::string& name) {
  OT_CHECK(t.numel() == 1, "training graph: output '", name, "' must be a scalar, has ",
           t.numel(), " elements");
  switch (t.dtype()) {
    case graph::DataType::kFloat: return t.data_as<float>()[0];
    case graph::DataType::kDouble: return t.data_as<double>()[0];
    case graph::DataType::kInt64: return static_cast<double>(t.data_as<int64_t>()[0]);
    default: fail("training graph: output '", name, "' has unsupported dtype ",
                  graph::dtype_short_name(t.dtype()));
  }
}

// "loss/r1" -> "loss": a replica partition's outputs carry the replica suffix.
std::string without_replica(const std::string& name) {
  const size_t p = name.rfind("/r");
  if (p == std::string::npos || p + 2 == name.size()) return name;
  for (size_t i = p + 2; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return name;
  return name.substr(0, p);
}

graph::Tensor float_scalar(float v) {
  return graph::Tensor::from_vector(graph::DataType::kFloat, {}, std::vector<float>{v});
}

}  // namespace

TrainingSession::TrainingSession(std::unique_ptr<graph::Model> model, SessionOptions opts) {
  graph::Graph& g = *model->graph;
  for (const graph::Value* out : g.outputs()) {
    const std::string& name = out->name();
    if (name.size() <= std::string(kUpdated).size() ||
        name.compare(name.size() - 8, 8, kUpdated) != 0)
      continue;
    graph::Value* s = g.find_value(name.substr(0, name.size() - 8));
    OT_CHECK(s && s->has_initializer(), "training graph: output '", name,
             "' has no initializer '", name.substr(0, name.size() - 8), "' to update");
    state_names_.push_back(s->name());
    state_[s->name()] = s->initializer();
    s->type = graph::ValueType::tensor(s->initializer().dtype(),
                                       graph::make_shape(s->initializer().dims()));
    g.clear_initializer(s);
    if (!s->is_graph_input()) g.mark_input(s);
  }
  OT_CHECK(!state_names_.empty(), "training graph has no `<state>.updated` output: nothing to train");
  for (const graph::Value* out : g.outputs()) output_names_.push_back(out->name());
  // Every step writes the new state over the old (no per-step allocation or copy-out).
  for (const std::string& name : state_names_) opts.output_aliases[name + kUpdated] = name;
  for (const graph::Value* in : g.inputs()) {
    has_lr_ |= in->name() == "lr";
    has_loss_scale_ |= in->name() == "loss_scale";
  }
  session_ = std::make_unique<InferenceSession>(std::move(model), std::move(opts));
  on_device_ = !session_->device().host_memory();
  if (on_device_)
    for (const auto& [name, t] : state_) session_->set_resident(name, t);
}

void TrainingSession::sync_host() const {
  if (!host_stale_) return;
  for (auto& [name, t] : state_) t = session_->get_resident(name);
  host_stale_ = false;
}

StepResult TrainingSession::step(const std::map<std::string, graph::Tensor>& batch, float lr,
                                 float loss_scale, uint64_t seed) {
  session_->set_random_seed(seed);
  std::map<std::string, graph::Tensor> feeds = batch;
  // On a device the state is resident in device memory and updated there; on the CPU the step
  // updates these buffers in place: detach them first from copies handed out earlier
  // (all_state(), a checkpoint being written), which keep the old value.
  if (!on_device_)
    for (auto& [name, t] : state_) {
      t.mutable_data();
      feeds[name] = t;
    }
  if (has_lr_) feeds["lr"] = float_scalar(lr);
  if (has_loss_scale_) feeds["loss_scale"] = float_scalar(loss_scale);
  std::vector<graph::Tensor> outs = session_->run(feeds);
  host_stale_ = on_device_;
  StepResult r;
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string& name = output_names_[i];
    const std::string base = without_replica(name);
    if (base == "loss") {
      r.loss = scalar_of(outs[i], name);
    } else if (base == "correct") {
      r.correct = scalar_of(outs[i], name);
    }  // `S.updated` outputs were written into state_[S] (SessionOptions::output_aliases).
  }
  return r;
}

const graph::Tensor& TrainingSession::state(const std::string& name) const {
  sync_host();
  auto it = state_.find(name);
  OT_CHECK(it != state_.end(), "training session: '", name, "' is not graph state");
  return it->second;
}

void TrainingSession::set_state(const std::string& name, graph::Tensor value) {
  auto it = state_.find(name);
  OT_CHECK(it != state_.end(), "training session: '", name, "' is not graph state");
  OT_CHECK(it->second.dtype() == value.dtype() && it->second.dims() == value.dims(),
           "training session: new value of '", name, "' has dtype/dims ",
           graph::dtype_short_name(value.dtype()), graph::format_shape(graph::make_shape(value.dims())),
           ", expected ", graph::dtype_short_name(it->second.dtype()),
           graph::format_shape(graph::make_shape(it->second.dims())));
  if (on_device_) {
    sync_host();  // the other tensors' host copies stay current
    session_->set_resident(name, value);
  }
  it->second = std::move(value);
}

std::unique_ptr<graph::Model> TrainingSession::trained_model(const graph::Model& original) const {
  sync_host();
  std::unique_ptr<graph::Model> m = original.clone();
  for (graph::Value* v : m->graph->initializers()) {
    auto it = state_.find(v->name());
    if (it != state_.end()) m->graph->set_initializer(v, it->second);
  }
  return m;
}

}  // namespace onnxtrain::runtime
