// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 13): K-dimensional targets,
// optional class weights, ignore_index, reduction none / sum / mean. SCE is log-softmax along
// the class axis followed by the same NLL core.
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

OpSchema loss_schema(const char* op_type, bool softmax) {
  OpSchema s;
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
  return loss_schema("SoftmaxCrossEntropyLoss", true);
}
ONNXTRAIN_REGISTER_OP(negative_log_likelihood_loss) {
  return loss_schema("NegativeLogLikelihoodLoss", false);
}

}  // namespace onnxtrain::ops::loss
