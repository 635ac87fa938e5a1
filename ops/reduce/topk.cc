// TopK (opsets 1, 10, 11): the k largest (or smallest) elements along an axis and their int64
// indices. Ties go to the lower index and NaN counts as larger than every number, so results
// are deterministic whatever `sorted` says (unsorted output is returned sorted too).
#include <algorithm>
#include <numeric>

#include "ops/elementwise/dtypes.h"
#include "ops/reduce/grad_util.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::reduce {
namespace {

using ew::Tag;

// k from the attribute (opset < 10) or the values of the 1-element input 1 (nullopt: unknown).
std::optional<int64_t> k_of(const graph::Node& node, int64_t opset,
                            const std::optional<std::vector<int64_t>>& k_input,
                            const std::string& where) {
  if (opset < 10) {
    OT_CHECK(node.find_attr("k"), where, ": attribute 'k' is required before opset 10");
    return node.attr_int("k", 0);
  }
  if (!k_input) return std::nullopt;
  OT_CHECK(k_input->size() == 1, where, ": input 'K' must hold exactly 1 value, got ",
           k_input->size());
  return (*k_input)[0];
}

void check_k(int64_t k, int64_t n, const std::string& where) {
  OT_CHECK(k >= 0 && k <= n, where, ": k must be in [0, ", n, "] (the axis length), got ", k);
}

// x: (..., n, ...) [, K: (1)] -> values: (..., k, ...), indices: (..., k, ...) int64
void infer_topk(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  std::optional<std::vector<int64_t>> k_values;
  if (ctx.opset >= 10 && ctx.input_value(1)) k_values = to_int64s(*ctx.input_value(1), ctx.where());
  auto k = k_of(ctx.node, ctx.opset, k_values, ctx.where());
  std::optional<Shape> out;
  if (x.shape) {
    out = *x.shape;
    const auto axis = static_cast<size_t>(normalize_axis(
        ctx.node.attr_int("axis", -1), static_cast<int64_t>(out->size()), ctx.where()));
    if (k && (*out)[axis].is_known()) check_k(*k, (*out)[axis].value, ctx.where());
    (*out)[axis] = k ? Dim::known(*k) : Dim{};
  }
  set_output(ctx, 0, x.dtype, out);
  set_output(ctx, 1, DataType::kInt64, out);
}

// Strict "comes first" order of (value, index) pairs: larger (or smaller) value first, NaN
// before numbers when largest (after them when smallest), then the lower index.
template <typename C>
struct Before {
  const C* row;
  int64_t stride;
  bool largest;
  bool operator()(int64_t a, int64_t b) const {
    C va = row[a * stride], vb = row[b * stride];
    bool na = ew::is_nan(va), nb = ew::is_nan(vb);
    if (na || nb) {
      if (na && nb) return a < b;
      return largest ? na : nb;
    }
    if (va != vb) return largest ? va > vb : va < vb;
    return a < b;
  }
};

class TopKKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const std::string where = ctx.node().describe();
    const auto axis =
        static_cast<size_t>(normalize_axis(ctx.node().attr_int("axis", -1), x.rank(), where));
    std::optional<std::vector<int64_t>> k_values;
    if (ctx.opset() >= 10) {
      OT_CHECK(ctx.input(1), where, ": input 'K' is required from opset 10");
      k_values = shape::view_ints(*ctx.input(1), where);
    }
    const int64_t k = *k_of(ctx.node(), ctx.opset(), k_values, where);
    const int64_t n = x.dims[axis];
    check_k(k, n, where);
    const bool largest = ctx.opset() < 11 || ctx.node().attr_int("largest", 1) != 0;
    std::vector<int64_t> dims = x.dims;
    dims[axis] = k;
    TensorView& values = ctx.output(0, dims);
    TensorView* indices = ctx.has_output(1) ? &ctx.output(1, dims) : nullptr;
    int64_t inner = 1, outer = 1;
    for (size_t d = axis + 1; d < x.dims.size(); ++d) inner *= x.dims[d];
    for (size_t d = 0; d < axis; ++d) outer *= x.dims[d];
    if (k == 0 || outer * inner == 0) return;
    ew::dispatch(ew::NumericHalfTypes{} + ew::TypeList<ew::BFloat16>{}, x.dtype, where,
                 [&]<typename T>(Tag<T>) {
                   using C = ew::compute_t<T>;
                   const T* src = x.as<T>();
                   T* dst = values.as<T>();
                   int64_t* idx_out = indices ? indices->as<int64_t>() : nullptr;
                   ctx.parallel_for(outer * inner, std::max<int64_t>(1, 4096 / (n + 1)),
                                    [&](int64_t begin, int64_t end) {
                                      std::vector<C> row(static_cast<size_t>(n));
                                      std::vector<int64_t> order(static_cast<size_t>(n));
                                      for (int64_t r = begin; r < end; ++r) {
                                        const int64_t o = r / inner, i = r % inner;
                                        const T* base = src + o * n * inner + i;
                                        for (int64_t j = 0; j < n; ++j)
                                          row[j] = static_cast<C>(base[j * inner]);
                                        std::iota(order.begin(), order.end(), int64_t{0});
                                        std::partial_sort(order.begin(), order.begin() + k,
                                                          order.end(),
                                                          Before<C>{row.data(), 1, largest});
                                        const int64_t out_base = o * k * inner + i;
                                        for (int64_t j = 0; j < k; ++j) {
                                          dst[out_base + j * inner] = base[order[j] * inner];
                                          if (idx_out) idx_out[out_base + j * inner] = order[j];
                                        }
                                      }
                                    });
                 });
  }
};

// dX = zeros like X with dValues written back along the axis where Indices put them (the k
// indices of a row are distinct, so ScatterElements' reduction none suffices). Indices and K get
// none. A node whose Indices output is absent gets them from a second TopK in the backward.
void topk_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  const graph::Node& n = b.node();
  graph::Value* indices = b.output(1);
  if (!indices) {
    std::vector<graph::Value*> ins{b.input(0)};
    if (b.opset() >= 10) ins.push_back(b.input(1));
    indices = b.emit("TopK", ins, 2, n.attributes)[1];
  }
  graph::Value* x = b.input(0);
  b.set_input_grad(0,
                   b.emit1("ScatterElements", {grad::zeros_like(b, x), indices, b.output_grad(0)},
                           {graph::Attribute::make_int("axis", n.attr_int("axis", -1))}));
}

OpSchema make_topk(int since, int until) {
  OpSchema s;
  s.op_type = "TopK";
  s.since_version = since;
  s.until_version = until;
  s.infer = infer_topk;
  s.cpu_kernel = [](const graph::Node&) { return std::make_unique<TopKKernel>(); };
  s.gradient = topk_gradient;
  return s;
}

}  // namespace

// One registration per signature change: k attribute (1), k input (10), largest/sorted (11).
ONNXTRAIN_REGISTER_OP(topk_1) {
  return make_topk(1, 9);
}
ONNXTRAIN_REGISTER_OP(topk_10) {
  return make_topk(10, 10);
}
ONNXTRAIN_REGISTER_OP(topk_11) {
  return make_topk(11, 1 << 30);
}

}  // namespace onnxtrain::ops::reduce
