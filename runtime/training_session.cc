// TrainingSession (training_session.h).
#include "runtime/training_session.h"

#include <cmath>

#include "graph/error.h"
#include "graph/printer.h"
#include "graph/training_signature.h"

namespace onnxtrain::runtime {
namespace {

double scalar_of(const graph::Tensor& t, const std::string& name) {
  OT_CHECK(t.numel() == 1, "training graph: output '", name, "' must be a scalar, has ",
           t.numel(), " elements");
  switch (t.dtype()) {
    case graph::DataType::kFloat: return t.data_as<float>()[0];
    case graph::DataType::kDouble: return t.data_as<double>()[0];
    case graph::DataType::kInt64: return static_cast<double>(t.data_as<int64_t>()[0]);
    case graph::DataType::kBool: return t.data_as<bool>()[0] ? 1 : 0;
    default: fail("training graph: output '", name, "' has unsupported dtype ",
                  graph::dtype_short_name(t.dtype()));
  }
}

graph::Tensor float_scalar(float v) {
  return graph::Tensor::from_vector(graph::DataType::kFloat, {}, std::vector<float>{v});
}

}  // namespace

TrainingSession::TrainingSession(std::unique_ptr<graph::Model> model, SessionOptions opts)
    : signature_(model->training) {
  graph::Graph& g = *model->graph;
  graph::verify_training(*model, "training graph");
  for (const graph::StateBinding& b : signature_.state) {
    graph::Value* s = g.find_value(b.state);
    OT_CHECK(s->has_initializer(), "training graph: state '", b.state, "' has no initial value");
    state_names_.push_back(s->name());
    state_[s->name()] = s->initializer();
    s->type = graph::ValueType::tensor(s->initializer().dtype(),
                                       graph::make_shape(s->initializer().dims()));
    g.clear_initializer(s);
    if (!s->is_graph_input()) g.mark_input(s);
    // Every step writes the new state over the old (no per-step allocation or copy-out).
    opts.output_aliases[b.updated] = b.state;
  }
  OT_CHECK(!state_names_.empty(), "training graph: its training signature lists no state: nothing "
           "to train");
  for (size_t i = 0; i < g.outputs().size(); ++i)
    for (const graph::ResultBinding& r : signature_.results)
      if (r.name == g.outputs()[i]->name()) results_.emplace_back(i, r.role);
  if (const graph::InputBinding* b = signature_.find_input(graph::InputRole::kLearningRate))
    lr_input_ = b->name;
  if (const graph::InputBinding* b = signature_.find_input(graph::InputRole::kLossScale))
    loss_scale_input_ = b->name;
  if (const graph::InputBinding* b = signature_.find_input(graph::InputRole::kGradUnscale))
    grad_unscale_input_ = b->name;
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

std::map<std::string, graph::Tensor> TrainingSession::feeds(
    const std::map<std::string, graph::Tensor>& batch, float lr, float loss_scale,
    float grad_scale) {
  OT_CHECK(grad_scale > 0 && std::isfinite(grad_scale), "training session: the loss scale must "
           "be a positive finite number, got ", grad_scale);
  OT_CHECK(grad_scale == 1 || !grad_unscale_input_.empty(), "training session: a loss scale of ",
           grad_scale, " needs a graph built with loss scaling (--precision fp16)");
  std::map<std::string, graph::Tensor> feeds = batch;
  // On a device the state is resident in device memory and updated there; on the CPU the step
  // updates these buffers in place: detach them first from copies handed out earlier
  // (all_state(), a checkpoint being written), which keep the old value.
  if (!on_device_)
    for (auto& [name, t] : state_) {
      t.mutable_data();
      feeds[name] = t;
    }
  if (!lr_input_.empty()) feeds[lr_input_] = float_scalar(lr);
  if (!loss_scale_input_.empty()) feeds[loss_scale_input_] = float_scalar(loss_scale * grad_scale);
  if (!grad_unscale_input_.empty()) feeds[grad_unscale_input_] = float_scalar(1 / grad_scale);
  return feeds;
}

void TrainingSession::prepare(const std::map<std::string, graph::Tensor>& batch) {
  session_->prepare(feeds(batch, 0, 1, 1));
}

StepResult TrainingSession::step(const std::map<std::string, graph::Tensor>& batch, float lr,
                                 float loss_scale, uint64_t seed, float grad_scale) {
  session_->set_random_seed(seed);
  std::vector<graph::Tensor> outs = session_->run(feeds(batch, lr, loss_scale, grad_scale));
  host_stale_ = on_device_;
  // Updated state was written into state_ (SessionOptions::output_aliases).
  StepResult r;
  for (const auto& [i, role] : results_) {
    const std::string& name = session_->model().graph->outputs()[i]->name();
    const double v = scalar_of(outs[i], name);
    switch (role) {
      case graph::ResultRole::kLoss: r.loss += v; break;
      case graph::ResultRole::kCorrect: r.correct += v; break;
      case graph::ResultRole::kGradsFinite: r.finite = r.finite && v != 0; break;
    }
  }
  r.loss /= grad_scale;  // a power of two: exact
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
  for (const graph::StateBinding& b : signature_.state)
    OT_CHECK(b.state != name || b.kind != graph::StateKind::kWeightCopy, "training session: '",
             name, "' is a kept weight copy, derived from its master: set the master instead");
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
  // A master's kept bf16 copy (passes::keep_weight_copies) follows it: the convolutions read the
  // copy, which would otherwise still hold the old weight.
  for (const graph::LowPrecisionCopy& c : signature_.copies) {
    auto copy = c.master == name ? state_.find(c.copy) : state_.end();
    if (copy == state_.end()) continue;
    copy->second = graph::bf16_nearest(it->second);
    if (on_device_) session_->set_resident(c.copy, copy->second);
  }
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
