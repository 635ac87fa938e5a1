// The backward of numpy broadcasting: ai.onnxtrain.SumToShapeOf sums a gradient over the axes
// broadcasting expanded, and the helpers every elementwise gradient rule builds on.
#include <algorithm>
#include <array>
#include <type_traits>
#include <vector>

#include "ops/elementwise/grad_util.h"
#include "ops/simd_clones.h"

namespace onnxtrain::ops::ew {
namespace {

// ---- SumToShapeOf's loops. Sums are in double; bf16 / f16 / float32 inputs round once, on the
// store. Work is cut into pieces whose bounds depend on the shapes only (never on the thread
// count), each piece sums in a fixed order, and pieces of one output are added in order, so
// results are bit-identical for any intra-op budget. The loops are compiled for the CPU's widest
// vectors (ops/simd_clones.h).

template <typename T>
inline double widen(T v) {
  if constexpr (std::is_class_v<T>)
    return static_cast<double>(static_cast<float>(v));
  else
    return static_cast<double>(v);
}

template <typename T>
inline T narrow(double v) {
  if constexpr (std::is_class_v<T>)
    return T(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

// acc[j] += x[r * stride + j] for rows r in [0, rows), j in [0, w): rows in order. A tile of
// wider rows (stride > w) takes 8 rows per pass, summed in double before they are added to acc:
// 8x less accumulator traffic (measured single-threaded on [16, 262144] -> [262144] float32:
// 1.5 ms, against 3 ms a row per pass).
template <typename In>
OT_SIMD_CLONES void add_rows(const In* x, int64_t rows, int64_t stride, int64_t w, double* acc) {
  int64_t r = 0;
  if (stride != w) {
    for (; r + 8 <= rows; r += 8) {
      const In* v = x + r * stride;
      for (int64_t j = 0; j < w; ++j) {
        double s = widen(v[j]);
        for (int u = 1; u < 8; ++u) s += widen(v[j + u * stride]);
        acc[j] += s;
      }
    }
  }
  for (; r < rows; ++r) {
    const In* v = x + r * stride;
    for (int64_t j = 0; j < w; ++j) acc[j] += widen(v[j]);
  }
}

// y[j] = narrow(acc[j]) for j in [0, w).
template <typename Out>
OT_SIMD_CLONES void store_row(const double* acc, int64_t w, Out* y) {
  for (int64_t j = 0; j < w; ++j) y[j] = narrow<Out>(acc[j]);
}

// y[r] = sum of x[r * n .. r * n + n) for r in [0, rows): 8 double lanes merged in a fixed order.
template <typename In, typename Out>
OT_SIMD_CLONES void sum_runs(const In* x, int64_t rows, int64_t n, Out* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const In* v = x + r * n;
    double s[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int k = 0; k < 8; ++k) s[k] += widen(v[i + k]);
    for (int k = 0; i < n; ++i, ++k) s[k] += widen(v[i]);
    y[r] = narrow<Out>(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])));
  }
}

// x viewed as [outer, n, inner] (inner > 1) -> y[o * inner + i] = sum over r of x[o, r, i].
// Narrow rows (up to kNarrow) are one tile whose double accumulators stay in L1, and a block of
// rows is one contiguous read. Wider rows are cut into tiles of kWide columns (add_rows takes
// them 8 rows per pass); with at least kTiles tiles the columns alone give the threads work and
// every tile sums all its rows. Otherwise rows go in blocks of about kTile elements: each
// block's sums go to a partial row and the partials are added in block order.
template <typename In, typename Out>
void sum_columns(const In* x, int64_t outer, int64_t n, int64_t inner, Out* y,
                 const KernelContext& ctx) {
  constexpr int64_t kNarrow = 2048, kWide = 8192, kTiles = 8, kTile = 1 << 16;
  const int64_t w = inner <= kNarrow ? inner : std::min(inner, kWide);
  const int64_t tiles = (inner + w - 1) / w;
  const int64_t per_block = tiles >= kTiles ? n : std::max<int64_t>(1, kTile / w);
  const int64_t blocks = (n + per_block - 1) / per_block;
  std::vector<double> partial(blocks > 1 ? static_cast<size_t>(outer * blocks * inner) : 0);
  ctx.parallel_for(outer * blocks * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(static_cast<size_t>(w));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / (blocks * tiles), b = t / tiles % blocks, c0 = t % tiles * w;
      const int64_t m = std::min(w, inner - c0), r0 = b * per_block;
      double* a = blocks > 1 ? partial.data() + (o * blocks + b) * inner + c0 : acc.data();
      std::fill_n(a, m, 0.0);
      add_rows(x + (o * n + r0) * inner + c0, std::min(per_block, n - r0), inner, m, a);
      if (blocks == 1) store_row(a, m, y + o * inner + c0);
    }
  });
  if (blocks == 1) return;
  // Block partials of each column added in block order, columns spread over the threads.
  constexpr int64_t kCols = 1024;
  const int64_t chunks = (inner + kCols - 1) / kCols;
  ctx.parallel_for(outer * chunks, std::max<int64_t>(1, kTile / (blocks * kCols)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t t = begin; t < end; ++t) {
                       const int64_t o = t / chunks, c0 = t % chunks * kCols;
                       const int64_t m = std::min(kCols, inner - c0);
                       double* first = partial.data() + o * blocks * inner + c0;
                       add_rows(first + inner, blocks - 1, inner, m, first);
                       store_row(first, m, y + o * inner + c0);
                     }
                   });
}

// x viewed as [rows, n] -> y[r] = sum of row r. Long rows are cut into chunks of kChunk elements
// summed in parallel and added in chunk order.
template <typename In, typename Out>
void sum_rows(const In* x, int64_t rows, int64_t n, Out* y, const KernelContext& ctx) {
  constexpr int64_t kChunk = 1 << 14;
  if (n <= kChunk) {
    const int64_t grain = std::max<int64_t>(1, kChunk / std::max<int64_t>(n, 1));
    ctx.parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
      sum_runs(x + begin * n, end - begin, n, y + begin);
    });
    return;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(rows * chunks));
  ctx.parallel_for(rows * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = t / chunks, c0 = t % chunks * kChunk;
      sum_runs(x + r * n + c0, 1, std::min(kChunk, n - c0), partial.data() + t);
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[static_cast<size_t>(r * chunks + c)];
    y[r] = narrow<Out>(s);
  }
}

// dy: D, x: S with S numpy-broadcastable to D (only S is read) -> dx: S, dx = sum of dy over
// the broadcast axes. Accumulates in double so float32 sums over big batches stay accurate
// (bf16/f16 too: one rounding on store).
// The collapsed layout alternates kept and summed dims; each summed dim is one stage (the
// largest first), viewing the current values as [outer, n, inner]: column sums (inner > 1, e.g.
// a bias gradient [batch * seq, hidden] -> [hidden]) or row sums (inner == 1). Stages before the
// last write double intermediates.
class SumToShapeOfKernel final : public Kernel {
 public:
  explicit SumToShapeOfKernel(const graph::Node&) {}
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView& dy = required_input(ctx, 0);
    const TensorView& x = required_input(ctx, 1);
    TensorView& dx = ctx.output(0, x.dims);
    OT_CHECK(dx.dtype == dy.dtype, where, ": output dtype ", graph::dtype_short_name(dx.dtype),
             " differs from dY's ", graph::dtype_short_name(dy.dtype));
    dispatch(FloatTypes{} + TypeList<Half, BFloat16>{}, dy.dtype, where, [&](auto tag) {
      using T = typename decltype(tag)::type;
      reduce<T>(dy, x.dims, dx.as<T>(), where, ctx);
    });
  }

 private:
  template <typename T>
  static void reduce(const TensorView& dy, std::span<const int64_t> x_dims, T* out,
                     const std::string& where, const KernelContext& ctx) {
    const int64_t n_out = numel(x_dims);
    std::array<std::span<const int64_t>, 1> operands{x_dims};
    BroadcastLayout layout = make_layout(dy.dims, operands, where);
    if (layout.total == 0) {
      std::fill_n(out, n_out, T(0.0f));
      return;
    }
    std::vector<int64_t> dims = layout.dims;
    std::vector<bool> summed(dims.size());
    for (size_t d = 0; d < dims.size(); ++d) summed[d] = layout.strides[0][d] == 0;
    const T* in = dy.as<T>();
    if (std::find(summed.begin(), summed.end(), true) == summed.end()) {
      // Same elements in the same order (dy differs at most by dims of 1): a parallel copy, or
      // nothing when the plan placed dX over dY (OpSchema::view).
      if (out == in) return;
      ctx.parallel_for(n_out, 1 << 16, [&](int64_t begin, int64_t end) {
        std::copy(in + begin, in + end, out + begin);
      });
      return;
    }
    std::vector<double> cur, next;
    for (bool first = true;; first = false) {
      size_t d = dims.size();
      for (size_t k = 0; k < dims.size(); ++k)
        if (summed[k] && (d == dims.size() || dims[k] > dims[d])) d = k;
      const bool last = std::count(summed.begin(), summed.end(), true) == 1;
      int64_t outer = 1, inner = 1;
      for (size_t k = 0; k < d; ++k) outer *= dims[k];
      for (size_t k = d + 1; k < dims.size(); ++k) inner *= dims[k];
      if (!last) next.resize(static_cast<size_t>(outer * inner));
      auto stage = [&](const auto* src, auto* dst) {
        if (inner == 1)
          sum_rows(src, outer, dims[d], dst, ctx);
        else
          sum_columns(src, outer, dims[d], inner, dst, ctx);
      };
      if (first && last)
        stage(in, out);
      else if (first)
        stage(in, next.data());
      else if (last)
        stage(static_cast<const double*>(cur.data()), out);
      else
        stage(static_cast<const double*>(cur.data()), next.data());
      if (last) return;
      std::swap(cur, next);
      dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(d));
      summed.erase(summed.begin() + static_cast<std::ptrdiff_t>(d));
    }
  }
};

void infer_sum_to_shape_of(InferenceContext& ctx) {
  set_output(ctx, 0, tensor_input(ctx, 0).dtype, tensor_input(ctx, 1).shape);
}

// Same rank and every dim the same known size or the same symbol.
bool same_static_shape(const graph::Value* a, const graph::Value* b) {
  if (a == b) return true;
  if (!a->shape() || !b->shape() || a->shape()->size() != b->shape()->size()) return false;
  for (size_t d = 0; d < a->shape()->size(); ++d) {
    const graph::Dim& x = (*a->shape())[d];
    const graph::Dim& y = (*b->shape())[d];
    if (x.is_known() && y.is_known()) {
      if (x.value != y.value) return false;
    } else if (x.is_known() || y.is_known() || x.param.empty() || x.param != y.param) {
      return false;
    }
  }
  return true;
}

}  // namespace

void set_broadcast_grad(GradientBuilder& b, int i, graph::Value* full) {
  if (!b.needs_input_grad(i)) return;
  graph::Value* x = b.input(i);
  if (same_static_shape(x, b.output(0))) {
    b.set_input_grad(i, full);
    return;
  }
  b.set_input_grad(i, b.emit1("SumToShapeOf", {full, x}, {}, kOnnxtrainDomain));
}

graph::Value* scalar_like(GradientBuilder& b, graph::Value* like, double v,
                          const std::string& name_hint) {
  const DataType dt = like->dtype();
  if (dt == DataType::kDouble)
    return b.constant(graph::Tensor::from_vector(dt, {}, std::vector<double>{v}), name_hint);
  const auto f = static_cast<float>(v);
  if (dt == DataType::kBFloat16)
    return b.constant(graph::Tensor::from_vector(dt, {}, std::vector<BFloat16>{f}), name_hint);
  if (dt == DataType::kFloat16)
    return b.constant(graph::Tensor::from_vector(dt, {}, std::vector<Half>{f}), name_hint);
  OT_CHECK(dt == DataType::kFloat, b.node().describe(), ": gradient of '", like->name(),
           "' with dtype ", graph::dtype_short_name(dt),
           " is not supported (float32/float64/bfloat16/float16)");
  return b.constant(
      graph::Tensor::from_vector(dt, {}, std::vector<float>{static_cast<float>(v)}), name_hint);
}

graph::Value* emit_grad_op(GradientBuilder& b, const std::string& op_type,
                           const std::vector<graph::Value*>& inputs) {
  return b.emit1(op_type, inputs, b.node().attributes, kOnnxtrainDomain);
}

ONNXTRAIN_REGISTER_OP(ew_sum_to_shape_of) {
  OpSchema s = make_schema("SumToShapeOf", infer_sum_to_shape_of, factory<SumToShapeOfKernel>());
  s.domain = kOnnxtrainDomain;
  s.foldable = false;
  s.view = true;  // a dX as large as dY sums nothing: the same elements (CUDA: one copy_async)
  return s;
}

}  // namespace onnxtrain::ops::ew
