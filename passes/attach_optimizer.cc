// attach_optimizer (passes.h): one update node per trainable parameter, its optimizer state as
// initializers wired back through `<state>.updated` outputs.
//
// Which op implements which optimizer (T = the 1-based step, `optimizer.step` + 1):
//   kSgd       ai.onnxtrain.SGD(lr, X, G; weight_decay)                   plain SGD, no state
//              (`momentum` is ignored: SGD with momentum is kMomentum)
//   kMomentum  ai.onnx.preview.training.Momentum(lr, T, X, G, V; alpha = momentum, beta = 1,
//              norm_coefficient = weight_decay, mode standard|nesterov): v = mu v + (g + wd x),
//              x -= lr v (Nesterov: x -= lr (g + wd x + mu v)) -- torch.optim.SGD, dampening 0.
//   kAdam      ai.onnx.preview.training.Adam(lr, T, X, G, M, V; alpha = beta1, beta = beta2,
//              epsilon, norm_coefficient = weight_decay): Keras' Adam (epsilon added to
//              sqrt(v) before the bias correction), L2 decay folded into the gradient.
//   kAdamW     ai.onnxtrain.AdamW(lr, T, X, G, M, V; beta1, beta2, epsilon, weight_decay): the
//              same Adam step plus the decoupled decay x -= lr wd x (preview Adam's
//              norm_coefficient_post is not scaled by the learning rate, so it cannot express it).
//   kAdagrad   ai.onnx.preview.training.Adagrad(lr, T, X, G, H; epsilon, decay_factor = 0,
//              norm_coefficient = weight_decay): h += g^2, x -= lr g / (sqrt(h) + eps).
// Clipping: ai.onnxtrain.ClipByGlobalNorm over every `<p>_grad` before any update.
// Loss scaling (OptimizerOptions::loss_scaling): first
//   ai.onnxtrain.UnscaleGradients(grad_unscale, G_1..G_n) -> (G_1/S..G_n/S, grads_finite)
// then every update node takes `grads_finite` as a trailing guard input (the preview-domain
// ops move to the ai.onnxtrain domain, which has the guarded forms; unchanged otherwise) and
// the step count adds Cast(grads_finite) instead of 1: an overflowed step updates nothing.
#include "graph/error.h"
#include "ops/op_api.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

namespace {

using graph::Attribute;
using graph::DataType;
using graph::Graph;
using graph::Node;
using graph::Tensor;
using graph::Value;
using graph::ValueType;

using ops::kOnnxtrainDomain;
using ops::kPreviewTrainingDomain;
constexpr const char* kStepName = "optimizer.step";
constexpr const char* kGradUnscaleName = "grad_unscale";
constexpr const char* kGradsFiniteName = "grads_finite";

ValueType type_of(const Tensor& t) {
  return ValueType::tensor(t.dtype(), graph::make_shape(t.dims()));
}

struct Param {
  Value* value;
  Value* grad;
};

// Everything the pass needs exists, checked before the graph changes.
std::vector<Param> collect_params(const graph::Model& model,
                                  const std::vector<std::string>& params) {
  const Graph& g = *model.graph;
  std::vector<Param> out;
  for (const std::string& name : params) {
    Value* p = g.find_value(name);
    OT_CHECK(p && p->has_initializer(), "attach_optimizer: parameter '", name,
             "' is not an initializer of the main graph");
    const DataType dt = p->initializer().dtype();
    OT_CHECK(dt == DataType::kFloat || dt == DataType::kDouble, "attach_optimizer: parameter '",
             name, "' is ", graph::dtype_short_name(dt), ", only float/double can be trained");
    const graph::GradientBinding* gb = model.training.gradient_of(name);
    Value* grad = gb ? g.find_value(gb->grad) : nullptr;
    OT_CHECK(grad, "attach_optimizer: parameter '", name,
             "' has no gradient in the training signature (run autodiff with it in `wrt` first)");
    out.push_back({p, grad});
  }
  return out;
}

void check_free(const Graph& g, const std::string& name) {
  OT_CHECK(!g.find_value(name), "attach_optimizer: value '", name,
           "' already exists (was the optimizer attached twice?)");
}

class Builder {
 public:
  Builder(graph::Model& model, const OptimizerOptions& opts)
      : model_(model), g_(*model.graph), opts_(opts) {}

  OptimizerInfo run(const std::vector<std::string>& names) {
    std::vector<Param> params = collect_params(model_, names);
    for (const Param& p : params) {
      check_free(g_, p.value->name() + ".updated");
      for (const char* s : state_suffixes()) {
        check_free(g_, p.value->name() + s);
        check_free(g_, p.value->name() + s + ".updated");
      }
    }
    lr_ = learning_rate();
    if (opts_.loss_scaling && !params.empty()) unscale(params);
    if (opts_.clip_global_norm > 0 && !params.empty()) clip(params);
    if (opts_.kind != OptimizerKind::kSgd && !params.empty()) step_count();
    for (const Param& p : params) update(p);
    return info_;
  }

 private:
  // State tensors per parameter, in the order the update op takes them.
  std::vector<const char*> state_suffixes() const {
    switch (opts_.kind) {
      case OptimizerKind::kSgd:
        return {};
      case OptimizerKind::kMomentum:
        return {".velocity"};
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW:
        return {".m", ".v"};
      case OptimizerKind::kAdagrad:
        return {".accumulator"};
    }
    return {};
  }

  Value* learning_rate() {
    if (const graph::InputBinding* b = model_.training.find_input(graph::InputRole::kLearningRate))
      return g_.find_value(b->name);
    check_free(g_, "lr");
    Value* lr = g_.add_input("lr", ValueType::tensor(DataType::kFloat, graph::Shape{}));
    model_.training.inputs.push_back({lr->name(), graph::InputRole::kLearningRate});
    return lr;
  }

  void bind_state(Value* s, Value* updated, graph::StateKind kind) {
    model_.training.state.push_back(
        {.state = s->name(), .updated = updated->name(), .kind = kind, .original = s->name(),
         .replica = -1});
  }

  void clip(std::vector<Param>& params) {
    std::vector<Value*> grads;
    std::vector<std::string> outs;
    for (const Param& p : params) {
      grads.push_back(p.grad);
      outs.push_back(g_.fresh_name(p.value->name() + "_grad_clipped"));
    }
    Node* n = g_.add_node("ClipByGlobalNorm", grads, outs, "optimizer.clip_by_global_norm",
                          kOnnxtrainDomain);
    n->set_attr(Attribute::make_float("max_norm", opts_.clip_global_norm));
    for (size_t i = 0; i < params.size(); ++i) {
      n->output(i)->type = params[i].grad->type;
      params[i].grad = n->output(i);
    }
    model_.set_opset(kOnnxtrainDomain, 1);
  }

  void unscale(std::vector<Param>& params) {
    check_free(g_, kGradUnscaleName);
    check_free(g_, kGradsFiniteName);
    Value* inv = g_.add_input(kGradUnscaleName, ValueType::tensor(DataType::kFloat, graph::Shape{}));
    model_.training.inputs.push_back({inv->name(), graph::InputRole::kGradUnscale});
    std::vector<Value*> inputs = {inv};
    std::vector<std::string> outs;
    for (const Param& p : params) {
      inputs.push_back(p.grad);
      outs.push_back(g_.fresh_name(p.value->name() + "_grad_unscaled"));
    }
    outs.push_back(kGradsFiniteName);
    Node* n = g_.add_node("UnscaleGradients", inputs, outs, "optimizer.unscale_gradients",
                          kOnnxtrainDomain);
    for (size_t i = 0; i < params.size(); ++i) {
      n->output(i)->type = params[i].grad->type;
      params[i].grad = n->output(i);
    }
    finite_ = n->output(params.size());
    finite_->type = ValueType::tensor(DataType::kBool, graph::Shape{});
    g_.add_output(finite_);
    model_.training.results.push_back(
        {finite_->name(), graph::ResultRole::kGradsFinite, -1});
    model_.set_opset(kOnnxtrainDomain, 1);
  }

  // optimizer.step counts finished steps (0 at the start); this step's T is step + 1 (with
  // loss scaling, step + Cast(grads_finite): a skipped step is not counted).
  void step_count() {
    check_free(g_, kStepName);
    check_free(g_, std::string(kStepName) + ".updated");
    Value* step = g_.add_initializer(kStepName, Tensor(DataType::kInt64, {}));
    step->type = ValueType::tensor(DataType::kInt64, graph::Shape{});
    info_.state.push_back(kStepName);
    Value* one = nullptr;
    if (finite_) {
      Node* cast = g_.add_node("Cast", {finite_}, {g_.fresh_name("optimizer.step_increment")},
                               "optimizer.step_increment");
      cast->set_attr(Attribute::make_int("to", static_cast<int64_t>(DataType::kInt64)));
      one = cast->output(0);
    } else {
      one = g_.add_initializer(g_.fresh_name("optimizer.step_increment"),
                               Tensor::from_vector<int64_t>(DataType::kInt64, {}, {1}));
    }
    one->type = step->type;
    Node* add = g_.add_node("Add", {step, one}, {std::string(kStepName) + ".updated"},
                            "optimizer.step_count");
    t_ = add->output(0);
    t_->type = step->type;
    g_.add_output(t_);
    bind_state(step, t_, graph::StateKind::kStepCounter);
  }

  Value* zeros_like(const Value* p, const std::string& name) {
    Value* s = g_.add_initializer(name, Tensor(p->initializer().dtype(), p->initializer().dims()));
    s->type = type_of(p->initializer());
    info_.state.push_back(name);
    return s;
  }

  void update(const Param& p) {
    const std::string& name = p.value->name();
    std::vector<Value*> inputs = {lr_};
    if (t_) inputs.push_back(t_);
    inputs.push_back(p.value);
    inputs.push_back(p.grad);
    std::vector<std::string> outs = {name + ".updated"};
    std::vector<Value*> state = {p.value};
    for (const char* s : state_suffixes()) {
      state.push_back(zeros_like(p.value, name + s));
      inputs.push_back(state.back());
      outs.push_back(name + s + ".updated");
    }
    if (finite_) {
      // SGD's optional velocity slot stays empty: the guard is its fifth input.
      if (opts_.kind == OptimizerKind::kSgd) inputs.push_back(nullptr);
      inputs.push_back(finite_);
    }
    // The guarded forms live in the ai.onnxtrain domain only.
    const char* training_domain = finite_ ? kOnnxtrainDomain : kPreviewTrainingDomain;
    Node* n = nullptr;
    const std::string node_name = "optimizer." + name;
    switch (opts_.kind) {
      case OptimizerKind::kSgd:
        n = g_.add_node("SGD", inputs, outs, node_name, kOnnxtrainDomain);
        n->set_attr(Attribute::make_float("weight_decay", opts_.weight_decay));
        model_.set_opset(kOnnxtrainDomain, 1);
        break;
      case OptimizerKind::kMomentum:
        n = g_.add_node("Momentum", inputs, outs, node_name, training_domain);
        n->set_attr(Attribute::make_float("alpha", opts_.momentum));
        n->set_attr(Attribute::make_float("beta", 1.0f));
        n->set_attr(Attribute::make_float("norm_coefficient", opts_.weight_decay));
        n->set_attr(Attribute::make_string("mode", opts_.nesterov ? "nesterov" : "standard"));
        model_.set_opset(training_domain, 1);
        break;
      case OptimizerKind::kAdam:
        n = g_.add_node("Adam", inputs, outs, node_name, training_domain);
        n->set_attr(Attribute::make_float("alpha", opts_.beta1));
        n->set_attr(Attribute::make_float("beta", opts_.beta2));
        n->set_attr(Attribute::make_float("epsilon", opts_.epsilon));
        n->set_attr(Attribute::make_float("norm_coefficient", opts_.weight_decay));
        model_.set_opset(training_domain, 1);
        break;
      case OptimizerKind::kAdamW:
        n = g_.add_node("AdamW", inputs, outs, node_name, kOnnxtrainDomain);
        n->set_attr(Attribute::make_float("beta1", opts_.beta1));
        n->set_attr(Attribute::make_float("beta2", opts_.beta2));
        n->set_attr(Attribute::make_float("epsilon", opts_.epsilon));
        n->set_attr(Attribute::make_float("weight_decay", opts_.weight_decay));
        model_.set_opset(kOnnxtrainDomain, 1);
        break;
      case OptimizerKind::kAdagrad:
        n = g_.add_node("Adagrad", inputs, outs, node_name, training_domain);
        n->set_attr(Attribute::make_float("epsilon", opts_.epsilon));
        n->set_attr(Attribute::make_float("decay_factor", 0.0f));
        n->set_attr(Attribute::make_float("norm_coefficient", opts_.weight_decay));
        model_.set_opset(training_domain, 1);
        break;
    }
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      Value* out = n->output(i);
      out->type = type_of(p.value->initializer());
      g_.add_output(out);
      bind_state(state[i], out,
                 i == 0 ? graph::StateKind::kParameter : graph::StateKind::kOptimizerState);
    }
    ++info_.update_nodes;
  }

  graph::Model& model_;
  Graph& g_;
  const OptimizerOptions& opts_;
  OptimizerInfo info_;
  Value* lr_ = nullptr;
  Value* t_ = nullptr;
  Value* finite_ = nullptr;  // loss scaling: UnscaleGradients' grads_finite
};

}  // namespace

OptimizerInfo attach_optimizer(graph::Model& model, const std::vector<std::string>& params,
                               const OptimizerOptions& opts) {
  OT_CHECK(model.graph, "attach_optimizer: the model has no graph");
  OT_CHECK(opts.clip_global_norm >= 0, "attach_optimizer: clip_global_norm must be >= 0, got ",
           opts.clip_global_norm);
  OT_CHECK(opts.kind != OptimizerKind::kMomentum || opts.momentum > 0,
           "attach_optimizer: momentum must be > 0 for the momentum optimizer, got ",
           opts.momentum);
  OT_CHECK(!opts.nesterov || opts.kind == OptimizerKind::kMomentum,
           "attach_optimizer: nesterov applies to the momentum optimizer only");
  return Builder(model, opts).run(params);
}

}  // namespace onnxtrain::passes
