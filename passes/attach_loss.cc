// attach_loss (passes.h): appends the training loss (cross-entropy or MSE, summed over the batch
// and multiplied by `loss_scale`) and the `correct` count to the graph, in ops of its opset.
//
// Cross-entropy, logits (N, C, d1..dk), labels (N, d1..dk) int64:
//   opset >= 12  SoftmaxCrossEntropyLoss(logits, labels, reduction="sum").
//   opset 7-11   neither SoftmaxCrossEntropyLoss nor NegativeLogLikelihoodLoss exists, and
//                raising the model's opset would change the meaning of other ops (Softmax,
//                Reduce*, Squeeze, Split, ...), so the loss is spelled in ops of the model's own
//                opset: -ReduceSum(LogSoftmax(z) * (labels == class index)) with the classes
//                moved last (Transpose) so LogSoftmax's 2-D coercion normalizes over C alone.
//                This needs a known C; a label outside [0, C) contributes 0 instead of failing.
// Classes last (LossOptions::class_axis = -1, logits (N, d1..dk, C)): a Transpose first moves
// them to axis 1. An ignore_index leaves its labels out of the sum and of `correct`.
// MSE: per example the mean over the non-batch dims of (y - t)^2, summed over the batch.
#include <numeric>
#include <optional>

#include "graph/error.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

namespace {

using graph::Attribute;
using graph::DataType;
using graph::Dim;
using graph::Graph;
using graph::Model;
using graph::Node;
using graph::Shape;
using graph::Tensor;
using graph::Value;
using graph::ValueType;

constexpr const char* kLabels = "labels";
constexpr const char* kTargets = "targets";
constexpr const char* kLossScale = "loss_scale";
constexpr const char* kLoss = "loss";
constexpr const char* kCorrect = "correct";

std::string where(const Model& m) {
  return m.source_path.empty() ? "attach_loss: " : m.source_path + ": attach_loss: ";
}

ValueType scalar(DataType t) {
  return ValueType::tensor(t, Shape{});
}

// Appends nodes to the graph; every value it creates gets a fresh "loss.*" name and a type.
class Emitter {
 public:
  explicit Emitter(Model& model) : g_(*model.graph), opset_(model.opset_version("").value_or(1)) {}

  int64_t opset() const { return opset_; }

  Value* node(const std::string& op_type, const std::vector<Value*>& inputs,
              const std::string& name, ValueType type, std::vector<Attribute> attrs = {},
              const std::string& out_name = "") {
    const std::string out = out_name.empty() ? g_.fresh_name("loss." + name) : out_name;
    Node* n = g_.add_node(op_type, inputs, {out}, "loss." + name);
    for (Attribute& a : attrs) n->set_attr(std::move(a));
    n->output(0)->type = std::move(type);
    return n->output(0);
  }

  Value* constant(const std::string& name, Tensor t) {
    Value* v = g_.add_initializer(g_.fresh_name("loss." + name), t);
    v->type = ValueType::tensor(t.dtype(), graph::make_shape(t.dims()));
    return v;
  }

  // Reduce* over `axes` (all axes when empty), keepdims=0: the axes are an input from opset 13
  // for ReduceSum and from opset 18 for the other reductions, an attribute before.
  Value* reduce(const std::string& op_type, Value* x, const std::vector<int64_t>& axes,
                const std::string& name, ValueType type, const std::string& out_name = "") {
    std::vector<Attribute> attrs = {Attribute::make_int("keepdims", 0)};
    std::vector<Value*> inputs = {x};
    if (!axes.empty()) {
      const bool as_input = opset_ >= (op_type == "ReduceSum" ? 13 : 18);
      if (as_input) {
        inputs.push_back(constant(
            name + "_axes",
            Tensor::from_vector(DataType::kInt64, {static_cast<int64_t>(axes.size())}, axes)));
      } else {
        attrs.push_back(Attribute::make_ints("axes", axes));
      }
    }
    return node(op_type, inputs, name, std::move(type), std::move(attrs), out_name);
  }

  Value* cast(Value* x, DataType to, const std::string& name) {
    ValueType t = x->type;
    t.dtype = to;
    return node("Cast", {x}, name, t, {Attribute::make_int("to", static_cast<int64_t>(to))});
  }

 private:
  Graph& g_;
  int64_t opset_;
};

// The loss is a float scalar whatever the model's precision.
Value* to_float(Emitter& e, Value* x, const std::string& name) {
  return x->dtype() == DataType::kFloat ? x : e.cast(x, DataType::kFloat, name);
}

// The class dim of `shape` under class_axis (1 or -1); rank >= 2.
size_t class_dim(const Shape& shape, int64_t class_axis) {
  return class_axis == 1 ? 1 : shape.size() - 1;
}

LossKind resolve(const Model& m, const Value& logits, const LossOptions& opts) {
  const auto& shape = logits.shape();
  const bool float_scores = graph::is_float_dtype(logits.dtype());
  OT_CHECK(opts.class_axis == 1 || opts.class_axis == -1, where(m),
           "the class axis must be 1 (N, C, ...) or -1 (classes last), got ", opts.class_axis);
  if (opts.kind == LossKind::kAuto) {
    const Dim* c = shape && shape->size() >= 2 ? &(*shape)[class_dim(*shape, opts.class_axis)]
                                               : nullptr;
    if (opts.integer_labels) {
      // Integer labels with float scores of rank >= 2 are classes; a known single column is
      // a regression output whatever the labels' dtype.
      const bool classes = *opts.integer_labels && float_scores && (!shape || c) &&
                           !(c && c->is_known() && c->value == 1);
      return classes ? LossKind::kCrossEntropy : LossKind::kMse;
    }
    const bool classes = c && c->is_known() && c->value > 1;
    return classes && float_scores ? LossKind::kCrossEntropy : LossKind::kMse;
  }
  if (opts.kind == LossKind::kCrossEntropy) {
    OT_CHECK(!shape || shape->size() >= 2, where(m), "cross-entropy needs logits (N, C, ...), '",
             logits.name(), "' has rank ", shape ? shape->size() : 0, " (use --loss mse)");
    const Dim* c = shape ? &(*shape)[class_dim(*shape, opts.class_axis)] : nullptr;
    OT_CHECK(!c || !c->is_known() || c->value > 1, where(m), "cross-entropy on '", logits.name(),
             "' with ", c ? c->value : 0,
             " class is meaningless (use --loss mse for a single output)");
  }
  return opts.kind;
}

// (N, d1..dk, C) -> (N, C, d1..dk): the layout SoftmaxCrossEntropyLoss and ArgMax(axis 1) read.
Value* classes_to_axis_1(Emitter& e, Value* logits) {
  const auto rank = static_cast<int64_t>(logits->shape()->size());
  std::vector<int64_t> perm = {0, rank - 1};
  for (int64_t k = 1; k < rank - 1; ++k) perm.push_back(k);
  Shape moved;
  for (int64_t k : perm) moved.push_back((*logits->shape())[static_cast<size_t>(k)]);
  return e.node("Transpose", {logits}, "classes_axis_1",
                ValueType::tensor(logits->dtype(), moved), {Attribute::make_ints("perm", perm)});
}

void check_free(const Model& m, const char* name) {
  const Value* v = m.graph->find_value(name);
  OT_CHECK(!v, where(m), "the model already has a value named '", name,
           "', a name the training graph reserves for its own ", name, " (rename it in the model)");
}

// The composed cross-entropy (opsets 7-11) needs Equal on int64 and a known class count.
void check_composable(const Model& m, const Value& logits, int64_t opset, int64_t class_axis) {
  const auto& shape = logits.shape();
  OT_CHECK(opset >= 7, where(m), "cross-entropy needs ai.onnx opset 7 or newer, the model has ",
           opset);
  OT_CHECK(shape && (*shape)[class_dim(*shape, class_axis)].is_known(), where(m),
           "cross-entropy at opset ", opset,
           " (before SoftmaxCrossEntropyLoss) needs the class count of '", logits.name(),
           "' to be known");
}

// Cross-entropy for opsets 7-11 (see the file comment): logits (N, C, d..) -> scalar sum.
Value* cross_entropy_composed(Emitter& e, Value* logits, Value* labels) {
  const auto& shape = logits->shape();
  const auto rank = static_cast<int64_t>(shape->size());
  const int64_t classes = (*shape)[1].value;
  // Classes last: (N, d1..dk, C).
  Shape last = *shape;
  last.erase(last.begin() + 1);
  last.push_back(Dim::known(classes));
  Value* z = logits;
  if (rank > 2) {
    std::vector<int64_t> perm = {0};
    for (int64_t k = 2; k < rank; ++k) perm.push_back(k);
    perm.push_back(1);
    z = e.node("Transpose", {logits}, "classes_last", ValueType::tensor(logits->dtype(), last),
               {Attribute::make_ints("perm", perm)});
  }
  Value* logp =
      e.node("LogSoftmax", {z}, "log_softmax", z->type, {Attribute::make_int("axis", rank - 1)});
  Shape label_shape = last;
  label_shape.back() = Dim::known(1);
  Value* label_col = e.node("Unsqueeze", {labels}, "labels_unsqueezed",
                            ValueType::tensor(DataType::kInt64, label_shape),
                            {Attribute::make_ints("axes", {rank - 1})});
  std::vector<int64_t> class_dims(static_cast<size_t>(rank), 1);
  class_dims.back() = classes;
  std::vector<int64_t> ids(static_cast<size_t>(classes));
  std::iota(ids.begin(), ids.end(), 0);
  Value* class_ids =
      e.constant("class_ids", Tensor::from_vector(DataType::kInt64, class_dims, ids));
  Value* hit = e.node("Equal", {label_col, class_ids}, "label_one_hot",
                      ValueType::tensor(DataType::kBool, last));
  Value* one_hot = e.cast(hit, logits->dtype(), "label_one_hot_float");
  Value* picked = e.node("Mul", {logp, one_hot}, "label_log_prob", logp->type);
  Value* sum = e.reduce("ReduceSum", picked, {}, "log_prob_sum", scalar(logits->dtype()));
  return e.node("Neg", {sum}, "cross_entropy_sum", scalar(logits->dtype()));
}

// correct = ReduceSum(Cast<float>(Equal(ArgMax(logits, axis=1, keepdims=0), labels))), and
// And(.., labels != ignore_index) for an ignore_index that is a class id (a negative one never
// equals an ArgMax).
Value* correct_count(Emitter& e, Value* logits, Value* labels, std::optional<int64_t> ignore) {
  Value* pred = e.node("ArgMax", {logits}, "prediction", labels->type,
                       {Attribute::make_int("axis", 1), Attribute::make_int("keepdims", 0)});
  ValueType hit_type = labels->type;
  hit_type.dtype = DataType::kBool;
  Value* hit = e.node("Equal", {pred, labels}, "prediction_hit", hit_type);
  if (ignore && *ignore >= 0) {
    Value* id = e.constant("ignore_index", Tensor::from_vector(DataType::kInt64, {}, std::vector<int64_t>{*ignore}));
    Value* padding = e.node("Equal", {labels, id}, "label_ignored", hit_type);
    Value* counted = e.node("Not", {padding}, "label_counted", hit_type);
    hit = e.node("And", {hit, counted}, "prediction_hit_counted", hit_type);
  }
  Value* hits = e.cast(hit, DataType::kFloat, "prediction_hit_float");
  return e.reduce("ReduceSum", hits, {}, "correct", scalar(DataType::kFloat), kCorrect);
}

// Sum over the batch of the per-example mean of (y - t)^2, in the output's dtype.
Value* squared_error_sum(Emitter& e, Value* y, Value* targets) {
  Value* diff = e.node("Sub", {y, targets}, "error", y->type);
  Value* sq = e.node("Mul", {diff, diff}, "squared_error", y->type);
  // (N, d1..dk) -> (N, d1*..*dk); a rank-1 output becomes (N, 1).
  std::optional<Shape> flat;
  if (y->shape()) {
    Dim inner = Dim::known(1);
    for (size_t k = 1; k < y->shape()->size(); ++k) {
      const Dim& d = (*y->shape())[k];
      inner = inner.is_known() && d.is_known() ? Dim::known(inner.value * d.value) : Dim{};
    }
    flat = Shape{(*y->shape())[0], inner};
  }
  Value* rows = e.node("Flatten", {sq}, "squared_error_rows", ValueType::tensor(y->dtype(), flat),
                       {Attribute::make_int("axis", 1)});
  std::optional<Shape> batch;
  if (flat) batch = Shape{(*flat)[0]};
  Value* per_example =
      e.reduce("ReduceMean", rows, {1}, "squared_error_mean", ValueType::tensor(y->dtype(), batch));
  return e.reduce("ReduceSum", per_example, {}, "squared_error_sum", scalar(y->dtype()));
}

// --loss output:NAME: the model's own scalar loss (a mean over its rows) x loss_scale.
LossInfo attach_model_loss(Model& model, Value* out) {
  Graph& g = *model.graph;
  const auto& shape = out->shape();
  int64_t elements = 1;
  if (shape)
    for (const Dim& d : *shape) elements = d.is_known() && elements > 0 ? elements * d.value : -1;
  OT_CHECK(!shape || elements == 1, where(model), "--loss output: '", out->name(),
           "' must be a scalar loss (one element); it has rank ", shape ? shape->size() : 0,
           elements > 1 ? cat(" and ", elements, " elements") : std::string());
  check_free(model, kLossScale);
  Emitter e(model);
  Value* scale = g.add_input(kLossScale, scalar(DataType::kFloat));
  Value* flat = out;
  if (!shape || !shape->empty())
    flat = e.reduce("ReduceSum", out, {}, "model_loss_scalar", scalar(out->dtype()));
  // The model may well call its loss "loss" (exports with labels as an input do).
  const std::string name = g.find_value(kLoss) ? g.fresh_name(kLoss) : std::string(kLoss);
  Value* loss = e.node("Mul", {to_float(e, flat, "model_loss_float"), scale}, "scaled",
                       scalar(DataType::kFloat), {}, name);
  g.add_output(loss);
  graph::TrainingSignature& sig = model.training;
  sig.inputs.push_back({scale->name(), graph::InputRole::kLossScale});
  sig.results.push_back({loss->name(), graph::ResultRole::kLoss, -1});
  sig.model_loss = out->name();
  LossInfo info;
  info.kind = LossKind::kOutput;
  info.loss = loss->name();
  return info;
}

}  // namespace

LossInfo attach_loss(graph::Model& model, const std::string& logits_name, const LossOptions& opts) {
  Graph& g = *model.graph;
  Value* logits = g.find_value(logits_name);
  OT_CHECK(logits, where(model), "logits '", logits_name, "' is not a value of the main graph");
  OT_CHECK(logits->type.is_tensor() && graph::is_float_dtype(logits->dtype()), where(model),
           "logits '", logits_name, "' must be a float tensor, it is ",
           logits->type.is_tensor() ? graph::dtype_short_name(logits->dtype()) : "not a tensor",
           logits->dtype() == DataType::kUndefined ? " (run infer_shapes first)" : "");
  LossInfo info;
  if (opts.kind == LossKind::kOutput) return attach_model_loss(model, logits);
  info.kind = resolve(model, *logits, opts);
  const bool ce = info.kind == LossKind::kCrossEntropy;
  const bool move_classes = ce && opts.class_axis == -1 && logits->shape() &&
                            logits->shape()->size() > 2;
  OT_CHECK(!ce || opts.class_axis == 1 || logits->shape(), where(model), "logits '",
           logits->name(), "' have no known rank, so the classes-last axis is unknown");
  OT_CHECK(!opts.ignore_index || ce, where(model), "an ignore_index needs cross-entropy");
  // Everything that can fail is checked before the graph changes.
  for (const char* name : {kLoss, kLossScale}) check_free(model, name);
  for (const char* name : ce ? std::vector{kLabels, kCorrect} : std::vector{kTargets})
    check_free(model, name);
  Emitter e(model);
  if (ce && e.opset() < 12) {
    OT_CHECK(!opts.ignore_index || *opts.ignore_index < 0, where(model), "ignore_index ",
             *opts.ignore_index, " is a class id; before opset 12 only a negative one works");
    check_composable(model, *logits, e.opset(), opts.class_axis);
  }
  OT_CHECK(ce || !logits->shape() || !logits->shape()->empty(), where(model),
           "MSE needs a batch dim, '", logits->name(), "' is a scalar");

  // Inputs in the order of the convention: labels / targets, then loss_scale.
  Value* truth = nullptr;
  if (ce) {
    std::optional<Shape> label_shape;
    if (logits->shape()) {
      label_shape = *logits->shape();
      label_shape->erase(label_shape->begin() +
                         static_cast<std::ptrdiff_t>(class_dim(*label_shape, opts.class_axis)));
    }
    truth = g.add_input(kLabels, ValueType::tensor(DataType::kInt64, label_shape));
  } else {
    truth = g.add_input(kTargets, logits->type);
  }
  Value* scale = g.add_input(kLossScale, scalar(DataType::kFloat));
  graph::TrainingSignature& sig = model.training;
  sig.inputs.push_back({truth->name(), ce ? graph::InputRole::kLabels : graph::InputRole::kTargets});
  sig.inputs.push_back({scale->name(), graph::InputRole::kLossScale});
  sig.ignore_index = opts.ignore_index;
  if (move_classes) logits = classes_to_axis_1(e, logits);
  Value* sum = nullptr;
  if (ce && e.opset() >= 12) {
    std::vector<Attribute> attrs = {Attribute::make_string("reduction", "sum")};
    if (opts.ignore_index) attrs.push_back(Attribute::make_int("ignore_index", *opts.ignore_index));
    sum = e.node("SoftmaxCrossEntropyLoss", {logits, truth}, "cross_entropy_sum",
                 scalar(logits->dtype()), std::move(attrs));
  } else if (ce) {
    sum = cross_entropy_composed(e, logits, truth);
  } else {
    sum = squared_error_sum(e, logits, truth);
  }
  Value* loss = e.node("Mul", {to_float(e, sum, "loss_sum_float"), scale}, "scaled",
                       scalar(DataType::kFloat), {}, kLoss);
  g.add_output(loss);
  info.loss = kLoss;
  sig.results.push_back({loss->name(), graph::ResultRole::kLoss, -1});
  if (ce) {
    Value* correct = correct_count(e, logits, truth, opts.ignore_index);
    g.add_output(correct);
    info.correct = kCorrect;
    sig.results.push_back({correct->name(), graph::ResultRole::kCorrect, -1});
  }
  return info;
}

}  // namespace onnxtrain::passes
