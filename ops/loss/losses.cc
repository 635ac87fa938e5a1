// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 13): K-dimensional targets,
// optional class weights, ignore_index, reduction none / sum / mean. SCE is log-softmax along
// the class axis followed by the same NLL core. Gradients (w.r.t. the scores only) are the
// ai.onnxtrain SoftmaxCrossEntropyLossGrad / NegativeLogLikelihoodLossGrad ops.
#include <cmath>
#include <optional>

#include "ops/reduce/softmax.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::loss {

namespace {

using reduce::CompensatedSum;
using reduce::Lanes;

enum class Reduction { kNone, kSum, kMean };

Reduction reduction_of(const graph::Node& node) {
  const std::string r = node.attr_string("reduction", "mean");
  if (r == "none") return Reduction::kNone;
  if (r == "sum") return Reduction::kSum;
  OT_CHECK(r == "mean", node.describe(), ": reduction must be none, sum or mean, got '", r, "'");
  return Reduction::kMean;
}

std::optional<int64_t> ignore_index_of(const graph::Node& node) {
  if (!node.find_attr("ignore_index")) return std::nullopt;
  return node.attr_int("ignore_index", 0);
}

// scores: (N, C, d1..dk), target: (N, d1..dk) -> loss: (N, d1..dk) for none, () otherwise;
// SCE's optional second output log_prob has the scores' shape.
void infer_loss(InferenceContext& ctx) {
  const ValueType& scores = tensor_input(ctx, 0);
  const ValueType& target = tensor_input(ctx, 1);
  if (scores.shape) {
    OT_CHECK(scores.shape->size() >= 2, ctx.where(), ": input needs shape (N, C, ...), got rank ",
             scores.shape->size());
  }
  OT_CHECK(target.dtype == DataType::kInt64 || target.dtype == DataType::kInt32 ||
               target.dtype == DataType::kUndefined,
           ctx.where(), ": target must be int32 or int64");
  std::optional<Shape> out_shape = Shape{};
  if (reduction_of(ctx.node) == Reduction::kNone) {
    out_shape = target.shape;
    if (!out_shape && scores.shape) {
      out_shape = *scores.shape;
      out_shape->erase(out_shape->begin() + 1);
    }
  }
  set_output(ctx, 0, scores.dtype, out_shape);
  if (ctx.node.outputs().size() > 1) set_output(ctx, 1, scores.dtype, scores.shape);
}

// log_prob: lanes [N, C, D], target: (N, D), weight: (C) or null -> out: (N, D) or ()
template <typename T, typename L>
void nll_core(const Lanes& l, const T* log_prob, const L* target, const T* weight,
              std::optional<int64_t> ignore, Reduction red, T* out, const std::string& where) {
  CompensatedSum total, weight_sum;
  for (int64_t nn = 0; nn < l.outer; ++nn) {
    for (int64_t d = 0; d < l.inner; ++d) {
      const int64_t k = nn * l.inner + d;
      const auto label = static_cast<int64_t>(target[k]);
      double loss = 0, w = 0;
      if (!ignore || label != *ignore) {
        OT_CHECK(label >= 0 && label < l.n, where, ": target ", label, " is out of range for ", l.n,
                 " classes");
        w = weight ? static_cast<double>(weight[label]) : 1.0;
        loss = -static_cast<double>(log_prob[(nn * l.n + label) * l.inner + d]) * w;
      }
      if (red == Reduction::kNone) out[k] = static_cast<T>(loss);
      total.add(loss);
      weight_sum.add(w);
    }
  }
  if (red == Reduction::kSum) out[0] = static_cast<T>(total.value());
  if (red == Reduction::kMean) out[0] = static_cast<T>(total.value() / weight_sum.value());
}

// input: (N, C, d1..dk) scores (SCE) or log-probabilities (NLL), target: (N, d1..dk),
// weight: (C) optional -> loss [, log_prob: (N, C, d1..dk) for SCE]
class LossKernel final : public Kernel {
 public:
  LossKernel(const graph::Node& node, bool softmax) : node_(node), softmax_(softmax) {}
  void run(KernelContext& ctx) override {
    const std::string where = node_.describe();
    const TensorView& x = *ctx.input(0);
    const TensorView& target = *ctx.input(1);
    const TensorView* weight = ctx.input(2);
    OT_CHECK(x.rank() >= 2, where, ": input needs shape (N, C, ...), got rank ", x.rank());
    std::vector<int64_t> expect = x.dims;
    expect.erase(expect.begin() + 1);
    OT_CHECK(target.dims == expect, where, ": target dims do not match input dims without C");
    const Lanes l = reduce::lanes_around(x.dims, 1);
    OT_CHECK(!weight || (weight->rank() == 1 && weight->dims[0] == l.n && weight->dtype == x.dtype),
             where, ": weight must be a (C) tensor of the input's type");
    const Reduction red = reduction_of(node_);
    TensorView& out = red == Reduction::kNone ? ctx.output(0, target.dims) : ctx.output(0, {});
    reduce::dispatch<reduce::FloatTypes>(x.dtype, where, [&]<typename T>() {
      const T* log_prob = x.as<T>();
      if (softmax_) {
        T* lp = ctx.has_output(1) ? ctx.output(1, x.dims).as<T>()
                                  : static_cast<T*>(ctx.scratch(x.nbytes()));
        reduce::softmax_lanes(l, x.as<T>(), lp, /*log=*/true, ctx);
        log_prob = lp;
      }
      const T* w = weight ? weight->as<T>() : nullptr;
      if (target.dtype == DataType::kInt64)
        nll_core(l, log_prob, target.as<int64_t>(), w, ignore_index_of(node_), red, out.as<T>(),
                 where);
      else if (target.dtype == DataType::kInt32)
        nll_core(l, log_prob, target.as<int32_t>(), w, ignore_index_of(node_), red, out.as<T>(),
                 where);
      else
        fail(where, ": target must be int32 or int64");
    });
  }

 private:
  const graph::Node& node_;
  bool softmax_;
};


// ---- gradients w.r.t. the scores

// Label, class weight and upstream gradient factor of every (n, d) position.
template <typename T, typename L>
void nll_grad_core(const Lanes& l, const T* dloss, const L* target, const T* weight,
                   std::optional<int64_t> ignore, Reduction red, bool softmax, T* dx,
                   const std::string& where) {
  CompensatedSum weight_sum;
  const int64_t positions = l.outer * l.inner;
  for (int64_t k = 0; k < positions; ++k) {
    const auto label = static_cast<int64_t>(target[k]);
    if (ignore && label == *ignore) continue;
    OT_CHECK(label >= 0 && label < l.n, where, ": target ", label, " is out of range for ", l.n,
             " classes");
    weight_sum.add(weight ? static_cast<double>(weight[label]) : 1.0);
  }
  const double scale = red == Reduction::kMean ? 1.0 / weight_sum.value() : 1.0;
  for (int64_t nn = 0; nn < l.outer; ++nn) {
    for (int64_t d = 0; d < l.inner; ++d) {
      const int64_t k = nn * l.inner + d;
      const auto label = static_cast<int64_t>(target[k]);
      const bool ignored = ignore && label == *ignore;
      double g = 0;
      if (!ignored) {
        g = static_cast<double>(red == Reduction::kNone ? dloss[k] : dloss[0]) * scale *
            (weight ? static_cast<double>(weight[label]) : 1.0);
      }
      for (int64_t c = 0; c < l.n; ++c) {
        T& v = dx[(nn * l.n + c) * l.inner + d];
        // softmax: dx holds softmax(scores) here; d(-log p_label)/ds_c = p_c - [c == label].
        const double onehot = !ignored && c == label ? 1.0 : 0.0;
        v = static_cast<T>(softmax ? g * (static_cast<double>(v) - onehot) : -g * onehot);
      }
    }
  }
}

// dloss: loss's shape, input: (N, C, d1..dk) scores (SCE) or log-probabilities (NLL),
// target: (N, d1..dk), weight: (C) optional -> dinput: (N, C, d1..dk)
class LossGradKernel final : public Kernel {
 public:
  LossGradKernel(const graph::Node& node, bool softmax) : node_(node), softmax_(softmax) {}
  void run(KernelContext& ctx) override {
    const std::string where = node_.describe();
    const TensorView& dloss = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    const TensorView& target = *ctx.input(2);
    const TensorView* weight = ctx.input(3);
    OT_CHECK(x.rank() >= 2, where, ": input needs shape (N, C, ...), got rank ", x.rank());
    const Lanes l = reduce::lanes_around(x.dims, 1);
    const Reduction red = reduction_of(node_);
    OT_CHECK(dloss.dtype == x.dtype && dloss.numel() == (red == Reduction::kNone ? target.numel() : 1),
             where, ": dloss does not match the loss");
    OT_CHECK(target.numel() == l.outer * l.inner, where, ": target does not match the input");
    OT_CHECK(!weight || (weight->numel() == l.n && weight->dtype == x.dtype), where,
             ": weight must be a (C) tensor of the input's type");
    TensorView& dx = ctx.output(0, x.dims);
    reduce::dispatch<reduce::FloatTypes>(x.dtype, where, [&]<typename T>() {
      if (softmax_) reduce::softmax_lanes(l, x.as<T>(), dx.as<T>(), /*log=*/false, ctx);
      const T* w = weight ? weight->as<T>() : nullptr;
      const auto ignore = ignore_index_of(node_);
      if (target.dtype == DataType::kInt64)
        nll_grad_core(l, dloss.as<T>(), target.as<int64_t>(), w, ignore, red, softmax_,
                      dx.as<T>(), where);
      else if (target.dtype == DataType::kInt32)
        nll_grad_core(l, dloss.as<T>(), target.as<int32_t>(), w, ignore, red, softmax_,
                      dx.as<T>(), where);
      else
        fail(where, ": target must be int32 or int64");
    });
  }

 private:
  const graph::Node& node_;
  bool softmax_;
};

// dScores from the loss output (and, for SCE, from the log_prob output when it is used).
void loss_gradient(GradientBuilder& b, const char* grad_op) {
  if (!b.needs_input_grad(0)) return;
  const graph::Node& n = b.node();
  graph::Value* dx = nullptr;
  if (graph::Value* dloss = b.output_grad(0)) {
    dx = b.emit1(grad_op, {dloss, b.input(0), b.input(1), b.input(2)}, n.attributes,
                 kOnnxtrainDomain);
  }
  if (graph::Value* dlog_prob = b.num_outputs() > 1 ? b.output_grad(1) : nullptr) {
    graph::Value* d = b.emit1("LogSoftmaxGrad", {dlog_prob, b.output(1)},
                              {graph::Attribute::make_int("axis", 1),
                               graph::Attribute::make_int("coerce_2d", 0)},
                              kOnnxtrainDomain);
    dx = dx ? b.emit1("Add", {dx, d}) : d;
  }
  if (dx) b.set_input_grad(0, dx);
}

OpSchema loss_grad_schema(const char* op_type, bool softmax) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = op_type;
  s.infer = [](InferenceContext& ctx) { propagate_type(ctx, 0, 1); };
  s.cpu_kernel = [softmax](const graph::Node& n) {
    return std::make_unique<LossGradKernel>(n, softmax);
  };
  return s;
}

OpSchema loss_schema(const char* op_type, bool softmax, const char* grad_op) {
  OpSchema s;
  s.gradient = [grad_op](GradientBuilder& b) { loss_gradient(b, grad_op); };
  s.op_type = op_type;
  s.since_version = 12;
  s.infer = infer_loss;
  s.cpu_kernel = [softmax](const graph::Node& n) {
    return std::make_unique<LossKernel>(n, softmax);
  };
  return s;
}

}  // namespace

ONNXTRAIN_REGISTER_OP(softmax_cross_entropy_loss) {
  return loss_schema("SoftmaxCrossEntropyLoss", true, "SoftmaxCrossEntropyLossGrad");
}
ONNXTRAIN_REGISTER_OP(negative_log_likelihood_loss) {
  return loss_schema("NegativeLogLikelihoodLoss", false, "NegativeLogLikelihoodLossGrad");
}
ONNXTRAIN_REGISTER_OP(softmax_cross_entropy_loss_grad) {
  return loss_grad_schema("SoftmaxCrossEntropyLossGrad", true);
}
ONNXTRAIN_REGISTER_OP(negative_log_likelihood_loss_grad) {
  return loss_grad_schema("NegativeLogLikelihoodLossGrad", false);
}

}  // namespace onnxtrain::ops::loss
