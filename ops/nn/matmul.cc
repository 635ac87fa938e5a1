// Gemm (alpha, beta, transA, transB, broadcast C) and MatMul (numpy semantics: batched with
// broadcasting, 1-D operands promoted and dropped): oneDNN matmul in f32 and bf16/f16 (f32
// accumulation; f16 only where oneDNN has an implementation), a reference loop for the rest: f64,
// the integer types ONNX allows, and any low-precision case oneDNN refuses.
#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>
#include <unordered_map>

#include "graph/printer.h"
#include "ops/elementwise/grad_util.h"
#include "ops/nn/nn_util.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::nn {
namespace {

using dnnl::memory;

// A oneDNN matmul over the runtime's buffers; weights/src may be strided (transposed views).
class DnnlMatmul {
 public:
  // accumulate: dst = alpha * a b + sum_scale * dst (dst read in its own dtype).
  bool init(const memory::desc& a, const memory::desc& b, const memory::desc& c, float alpha,
            bool accumulate, float sum_scale = 1.0f) {
    prim_.reset();
    try {
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (accumulate) {
        dnnl::post_ops ops;
        ops.append_sum(sum_scale);
        attr.set_post_ops(ops);
      }
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
      a_ = a;
      b_ = b;
      c_ = c;
      pad_ = pd.scratchpad_desc();
      prim_ = dnnl::matmul(pd);
      stream_ = dnnl::stream(cpu_engine());
      warm_gemm_kernels(pd.impl_info_str(), a.data_type());
      return true;
    } catch (const dnnl::error&) {
      prim_.reset();
      return false;
    }
  }
  bool ready() const { return prim_.has_value(); }
  void reset() { prim_.reset(); }
  void execute(KernelContext& ctx, const void* a, const void* b, void* c) {
    const dnnl::engine& eng = cpu_engine();
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(a_, eng, const_cast<void*>(a))},
                                         {DNNL_ARG_WEIGHTS, memory(b_, eng, const_cast<void*>(b))},
                                         {DNNL_ARG_DST, memory(c_, eng, c)}};
    if (size_t bytes = pad_.get_size())
      args.emplace(DNNL_ARG_SCRATCHPAD, memory(pad_, eng, ctx.scratch(bytes)));
    prim_->execute(*stream_, args);
    stream_->wait();
  }

 private:
  memory::desc a_, b_, c_, pad_;
  std::optional<dnnl::primitive> prim_;
  std::optional<dnnl::stream> stream_;
};

// Floats (incl. bf16/f16) and the integer types Gemm/MatMul allow.
template <typename F>
void dispatch_numeric(DataType t, const std::string& where, F&& f) {
  switch (t) {
    case DataType::kInt32:
      f(int32_t{});
      return;
    case DataType::kInt64:
      f(int64_t{});
      return;
    case DataType::kUInt32:
      f(uint32_t{});
      return;
    case DataType::kUInt64:
      f(uint64_t{});
      return;
    default:
      dispatch_float_or_low(t, where, std::forward<F>(f));
  }
}

// Floats (bf16/f16 too) accumulate in double; integers in their own (wrapping) width.
template <typename T>
using Acc = std::conditional_t<ew::is_floating<T>, double, T>;

// The one rounding of an accumulated value to T: nearest-even for bfloat16 (whose constructor
// truncates), T's own conversion otherwise (nearest-even for float16).
template <typename T>
T round_to(Acc<T> v) {
  if constexpr (std::is_same_v<T, ew::BFloat16>) {
    const auto f = static_cast<float>(v);
    if (std::isnan(f)) return ew::BFloat16(f);
    uint32_t u = std::bit_cast<uint32_t>(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    ew::BFloat16 r;
    r.bits = static_cast<uint16_t>(u >> 16);
    return r;
  } else {
    return static_cast<T>(v);
  }
}

// oneDNN memory desc of `dims` in dtype `t` with the given strides (row-major when empty).
memory::desc dnnl_desc(std::span<const int64_t> dims, memory::data_type t,
                       std::span<const int64_t> strides = {}) {
  if (strides.empty()) return plain_desc(dims, t);
  return memory::desc(to_dnnl(dims), t, to_dnnl(strides));
}

void check_same_dtype(const std::string& where, const TensorView& a, const TensorView& b,
                      const char* name) {
  OT_CHECK(a.dtype == b.dtype, where, ": ", name, " is ", graph::dtype_short_name(b.dtype),
           ", A is ", graph::dtype_short_name(a.dtype));
}

// ---------------------------------------------------------------- Gemm

struct GemmDims {
  int64_t m = 0, k = 0, n = 0;
};

GemmDims gemm_dims(std::span<const int64_t> a, std::span<const int64_t> b, bool ta, bool tb,
                   const std::string& where) {
  OT_CHECK(a.size() == 2, where, ": A must have rank 2, got rank ", a.size());
  OT_CHECK(b.size() == 2, where, ": B must have rank 2, got rank ", b.size());
  GemmDims d{ta ? a[1] : a[0], ta ? a[0] : a[1], tb ? b[0] : b[1]};
  int64_t kb = tb ? b[1] : b[0];
  OT_CHECK(d.k == kb, where, ": A is ", join_dims(a), " (transA=", ta, "), B is ", join_dims(b),
           " (transB=", tb, "): inner dims ", d.k, " and ", kb, " differ");
  return d;
}

void check_gemm_c(std::span<const int64_t> c, int64_t m, int64_t n, const std::string& where) {
  bool ok = c.size() <= 2;
  if (ok && !c.empty()) ok = c.back() == 1 || c.back() == n;
  if (ok && c.size() == 2) ok = c[0] == 1 || c[0] == m;
  OT_CHECK(ok, where, ": C of shape ", join_dims(c), " does not broadcast to ", m, "x", n);
}

void infer_gemm(InferenceContext& ctx) {
  const std::string where = ctx.where();
  const ValueType& a = tensor_input(ctx, 0);
  const ValueType& b = tensor_input(ctx, 1);
  const bool ta = ctx.node.attr_int("transA", 0) != 0, tb = ctx.node.attr_int("transB", 0) != 0;
  if (a.shape)
    OT_CHECK(a.shape->size() == 2, where, ": A must have rank 2, got rank ", a.shape->size());
  if (b.shape)
    OT_CHECK(b.shape->size() == 2, where, ": B must have rank 2, got rank ", b.shape->size());
  Dim m = a.shape ? (*a.shape)[ta ? 1 : 0] : Dim{};
  Dim n = b.shape ? (*b.shape)[tb ? 0 : 1] : Dim{};
  auto ad = known_dims(a), bd = known_dims(b);
  if (ad && bd) {
    GemmDims d = gemm_dims(*ad, *bd, ta, tb, where);
    if (const ValueType* c = ctx.input_type(2))
      if (auto cd = known_dims(*c)) check_gemm_c(*cd, d.m, d.n, where);
  }
  set_output(ctx, 0, a.dtype, Shape{m, n});
}

// C read broadcast to (M, N): element (i, j) is c[i * row + j * col] (a stride is 0 along a
// broadcast dim); c == nullptr: no C term.
template <typename T>
struct GemmC {
  const T* c = nullptr;
  int64_t row = 0, col = 0;
};

// y = alpha * A' B' + beta * C, accumulated in Acc<T> and rounded to T once.
template <typename T>
void gemm_reference(const T* a, const T* b, GemmC<T> c, T* y, const GemmDims& d, bool ta, bool tb,
                    float alpha, float beta, const KernelContext& ctx) {
  const auto al = static_cast<Acc<T>>(alpha), be = static_cast<Acc<T>>(beta);
  ctx.parallel_for(d.m, 1, [&](int64_t begin, int64_t end) {
    std::vector<Acc<T>> row(d.n);
    for (int64_t i = begin; i < end; ++i) {
      std::fill(row.begin(), row.end(), Acc<T>{});
      for (int64_t p = 0; p < d.k; ++p) {
        const auto av = static_cast<Acc<T>>(ta ? a[p * d.m + i] : a[i * d.k + p]);
        for (int64_t j = 0; j < d.n; ++j)
          row[j] += av * static_cast<Acc<T>>(tb ? b[j * d.k + p] : b[p * d.n + j]);
      }
      for (int64_t j = 0; j < d.n; ++j) {
        Acc<T> v = al * row[j];
        if (c.c) v += be * static_cast<Acc<T>>(c.c[i * c.row + j * c.col]);
        y[i * d.n + j] = round_to<T>(v);
      }
    }
  });
}

// a: (M,K) or (K,M) with transA, b: (K,N) or (N,K) with transB, c: broadcastable to (M,N)
//   -> y: (M,N)
class GemmKernel final : public Kernel {
 public:
  explicit GemmKernel(const graph::Node& node)
      : where_(node.describe()),
        alpha_(node.attr_float("alpha", 1.0f)),
        beta_(node.attr_float("beta", 1.0f)),
        ta_(node.attr_int("transA", 0) != 0),
        tb_(node.attr_int("transB", 0) != 0) {}

  void prepare(KernelContext& ctx) override {
    const TensorView* a = ctx.input(0);
    const TensorView* b = ctx.input(1);
    const TensorView* c = ctx.input(2);
    OT_CHECK(a && b, where_, ": inputs A and B are required");
    check_same_dtype(where_, *a, *b, "B");
    d_ = gemm_dims(a->dims, b->dims, ta_, tb_, where_);
    if (c) {
      check_same_dtype(where_, *a, *c, "C");
      check_gemm_c(c->dims, d_.m, d_.n, where_);
    }
    a_dims_ = a->dims;
    b_dims_ = b->dims;
    c_dims_ = c ? std::optional(c->dims) : std::nullopt;
    dnnl_.reset();
    // oneDNN takes f32 and bf16 (and f16 where it has an implementation), accumulating in f32;
    // y holds C and the sum post-op adds beta * C. Refused cases run the reference loop.
    const std::optional<memory::data_type> dt = dnnl_float_type(a->dtype);
    if (!dt || d_.m == 0 || d_.n == 0 || d_.k == 0) return;
    std::vector<int64_t> ad{d_.m, d_.k}, bd{d_.k, d_.n};
    std::vector<int64_t> as = ta_ ? std::vector<int64_t>{1, d_.m} : std::vector<int64_t>{d_.k, 1};
    std::vector<int64_t> bs = tb_ ? std::vector<int64_t>{1, d_.k} : std::vector<int64_t>{d_.n, 1};
    ThreadBudget budget(ctx.num_threads());
    dnnl_.init(dnnl_desc(ad, *dt, as), dnnl_desc(bd, *dt, bs),
               dnnl_desc(std::vector{d_.m, d_.n}, *dt), alpha_, uses_c(), beta_);
  }

  void run(KernelContext& ctx) override {
    const TensorView* a = ctx.input(0);
    const TensorView* b = ctx.input(1);
    const TensorView* c = ctx.input(2);
    if (!a || !b || a->dims != a_dims_ || b->dims != b_dims_ ||
        (c ? std::optional(c->dims) : std::nullopt) != c_dims_)
      prepare(ctx);
    TensorView& y = ctx.output(0, std::vector<int64_t>{d_.m, d_.n});
    dispatch_numeric(a->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      const GemmC<T> gc = gemm_c<T>(c);
      if (dnnl_.ready()) {
        if (gc.c) copy_c<T>(gc, y.as<T>());
        ThreadBudget budget(ctx.num_threads());
        dnnl_.execute(ctx, a->data, b->data, y.data);
      } else {
        gemm_reference<T>(a->as<T>(), b->as<T>(), gc, y.as<T>(), d_, ta_, tb_, alpha_, beta_, ctx);
      }
    });
  }

 private:
  bool uses_c() const { return c_dims_ && beta_ != 0.0f; }

  // C with its broadcast strides over (M, N); none when absent or beta is 0.
  template <typename T>
  GemmC<T> gemm_c(const TensorView* c) const {
    if (!c || !uses_c()) return {};
    std::vector<int64_t> cd = c->dims;
    while (cd.size() < 2) cd.insert(cd.begin(), 1);
    return {c->as<T>(), cd[0] == 1 ? 0 : cd[1], cd[1] == 1 ? 0 : 1};
  }

  // y = C broadcast to (M, N): the dst oneDNN's sum post-op scales by beta and accumulates into.
  template <typename T>
  void copy_c(const GemmC<T>& c, T* y) const {
    for (int64_t i = 0; i < d_.m; ++i)
      for (int64_t j = 0; j < d_.n; ++j) y[i * d_.n + j] = c.c[i * c.row + j * c.col];
  }

  std::string where_;
  float alpha_, beta_;
  bool ta_, tb_;
  GemmDims d_;
  std::vector<int64_t> a_dims_, b_dims_;
  std::optional<std::vector<int64_t>> c_dims_;
  DnnlMatmul dnnl_;
};

// ---------------------------------------------------------------- MatMul

// The batched problem after numpy's 1-D promotion.
struct MatMulDims {
  std::vector<int64_t> a_batch, b_batch, batch;  // a/b batch padded to batch's rank
  int64_t m = 1, k = 1, n = 1;
  std::vector<int64_t> y_dims;
};

MatMulDims matmul_dims(std::span<const int64_t> a, std::span<const int64_t> b,
                       const std::string& where) {
  OT_CHECK(!a.empty() && !b.empty(), where, ": MatMul operands must have rank >= 1");
  MatMulDims d;
  std::vector<int64_t> ad(a.begin(), a.end()), bd(b.begin(), b.end());
  const bool a_vec = ad.size() == 1, b_vec = bd.size() == 1;
  if (a_vec) ad.insert(ad.begin(), 1);
  if (b_vec) bd.push_back(1);
  d.m = ad[ad.size() - 2];
  d.k = ad.back();
  d.n = bd.back();
  const int64_t kb = bd[bd.size() - 2];
  OT_CHECK(d.k == kb, where, ": A is ", join_dims(a), ", B is ", join_dims(b), ": inner dims ", d.k,
           " and ", kb, " differ");
  d.a_batch.assign(ad.begin(), ad.end() - 2);
  d.b_batch.assign(bd.begin(), bd.end() - 2);
  d.batch = broadcast_dims(d.a_batch, d.b_batch, where);
  while (d.a_batch.size() < d.batch.size()) d.a_batch.insert(d.a_batch.begin(), 1);
  while (d.b_batch.size() < d.batch.size()) d.b_batch.insert(d.b_batch.begin(), 1);
  d.y_dims = d.batch;
  if (!a_vec) d.y_dims.push_back(d.m);
  if (!b_vec) d.y_dims.push_back(d.n);
  return d;
}

void infer_matmul(InferenceContext& ctx) {
  const std::string where = ctx.where();
  const ValueType& a = tensor_input(ctx, 0);
  const ValueType& b = tensor_input(ctx, 1);
  if (!a.shape || !b.shape) {
    set_output(ctx, 0, a.dtype, std::nullopt);
    return;
  }
  Shape as = *a.shape, bs = *b.shape;
  // FusedMatMul's transA / transB (ONNX's MatMul has no such attributes).
  for (auto [shape, attr] : {std::pair{&as, "transA"}, std::pair{&bs, "transB"}}) {
    if (ctx.node.domain != kOnnxtrainDomain || ctx.node.attr_int(attr, 0) == 0) continue;
    OT_CHECK(shape->size() >= 2, where, ": ", attr, " needs an operand of rank >= 2");
    std::swap((*shape)[shape->size() - 2], (*shape)[shape->size() - 1]);
  }
  OT_CHECK(!as.empty() && !bs.empty(), where, ": MatMul operands must have rank >= 1");
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), Dim::known(1));
  if (b_vec) bs.push_back(Dim::known(1));
  const Dim& k = as.back();
  const Dim& kb = bs[bs.size() - 2];
  OT_CHECK(!k.is_known() || !kb.is_known() || k.value == kb.value, where, ": A is ",
           graph::format_shape(a.shape), ", B is ", graph::format_shape(b.shape), ": inner dims ",
           k.value, " and ", kb.value, " differ");
  auto batch =
      broadcast_shapes(Shape(as.begin(), as.end() - 2), Shape(bs.begin(), bs.end() - 2), where);
  Shape out = *batch;
  if (!a_vec) out.push_back(as[as.size() - 2]);
  if (!b_vec) out.push_back(bs.back());
  set_output(ctx, 0, a.dtype, out);
}

template <typename T>
void matmul_reference(const MatMulDims& d, const T* a, const T* b, T* y, const KernelContext& ctx) {
  const int64_t batches = product(d.batch);
  const size_t r = d.batch.size();
  std::vector<int64_t> a_stride(r), b_stride(r);  // 0 along broadcast dims
  int64_t as = d.m * d.k, bs = d.k * d.n;
  for (size_t i = r; i-- > 0;) {
    a_stride[i] = d.a_batch[i] == 1 ? 0 : as;
    b_stride[i] = d.b_batch[i] == 1 ? 0 : bs;
    as *= d.a_batch[i];
    bs *= d.b_batch[i];
  }
  ctx.parallel_for(batches * d.m, 1, [&](int64_t begin, int64_t end) {
    std::vector<Acc<T>> row(d.n);
    for (int64_t bm = begin; bm < end; ++bm) {
      const int64_t batch = bm / d.m, i = bm % d.m;
      int64_t a_off = 0, b_off = 0, rest = batch;
      for (size_t x = r; x-- > 0;) {
        const int64_t coord = rest % d.batch[x];
        rest /= d.batch[x];
        a_off += coord * a_stride[x];
        b_off += coord * b_stride[x];
      }
      const T* ap = a + a_off + i * d.k;
      const T* bp = b + b_off;
      std::fill(row.begin(), row.end(), Acc<T>{});
      for (int64_t p = 0; p < d.k; ++p) {
        const auto av = static_cast<Acc<T>>(ap[p]);
        for (int64_t j = 0; j < d.n; ++j) row[j] += av * static_cast<Acc<T>>(bp[p * d.n + j]);
      }
      T* yp = y + bm * d.n;
      for (int64_t j = 0; j < d.n; ++j) yp[j] = round_to<T>(row[j]);
    }
  });
}

// FusedMatMul's transA / transB: the operand's last two dims swapped.
std::vector<int64_t> swap_last2(std::span<const int64_t> dims, bool swap) {
  std::vector<int64_t> d(dims.begin(), dims.end());
  if (swap && d.size() >= 2) std::swap(d[d.size() - 2], d[d.size() - 1]);
  return d;
}

// Row-major strides of `stored` dims, reported in the order of the swapped (logical) dims: a
// transposed view of the buffer as it is.
std::vector<int64_t> swapped_strides(std::span<const int64_t> stored) {
  std::vector<int64_t> st(stored.size());
  int64_t s = 1;
  for (size_t i = stored.size(); i-- > 0;) {
    st[i] = s;
    s *= stored[i];
  }
  if (st.size() >= 2) std::swap(st[st.size() - 2], st[st.size() - 1]);
  return st;
}

// x (dims as stored) with its last two dims swapped, as a dense buffer (the reference loop's
// transposed operands).
template <typename T>
std::vector<T> transposed_copy(const T* x, std::span<const int64_t> dims) {
  const int64_t r = dims[dims.size() - 2], c = dims.back(), plane = r * c;
  const int64_t planes = product(dims) / std::max<int64_t>(plane, 1);
  std::vector<T> out(static_cast<size_t>(planes * plane));
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) out[p * plane + j * r + i] = x[p * plane + i * c + j];
  return out;
}

// a: (..., M, K) or (K), b: (..., K, N) or (K) -> y: (broadcast(...), M, N), 1-D dims dropped.
// FusedMatMul (ai.onnxtrain, passes::fold_transposes): transA / transB read A / B (rank >= 2)
// with their last two dims swapped -- (..., K, M) and (..., N, K) as stored -- through oneDNN
// strides, so no Transpose writes them out.
class MatMulKernel final : public Kernel {
 public:
  explicit MatMulKernel(const graph::Node& node)
      : where_(node.describe()),
        ta_(node.domain == kOnnxtrainDomain && node.attr_int("transA", 0) != 0),
        tb_(node.domain == kOnnxtrainDomain && node.attr_int("transB", 0) != 0) {}

  void prepare(KernelContext& ctx) override {
    const TensorView* a = ctx.input(0);
    const TensorView* b = ctx.input(1);
    OT_CHECK(a && b, where_, ": inputs A and B are required");
    check_same_dtype(where_, *a, *b, "B");
    OT_CHECK((!ta_ || a->dims.size() >= 2) && (!tb_ || b->dims.size() >= 2), where_,
             ": transA / transB need an operand of rank >= 2");
    d_ = matmul_dims(swap_last2(a->dims, ta_), swap_last2(b->dims, tb_), where_);
    a_dims_ = a->dims;
    b_dims_ = b->dims;
    dnnl_.reset();
    const size_t rank = d_.batch.size() + 2;
    // f32, bf16 (f16 where oneDNN has it) through oneDNN; the rest and refused cases: the loop.
    const std::optional<memory::data_type> dt = dnnl_float_type(a->dtype);
    if (!dt || rank > DNNL_MAX_NDIMS || product(d_.y_dims) == 0 || d_.k == 0) return;
    std::vector<int64_t> ad = d_.a_batch, bd = d_.b_batch, yd = d_.batch;
    ad.insert(ad.end(), {d_.m, d_.k});
    bd.insert(bd.end(), {d_.k, d_.n});
    yd.insert(yd.end(), {d_.m, d_.n});
    // A transposed operand: its stored (..., K, M) buffer with the last two strides swapped.
    const std::vector<int64_t> as = ta_ ? swapped_strides(swap_last2(ad, true)) : std::vector<int64_t>{};
    const std::vector<int64_t> bs = tb_ ? swapped_strides(swap_last2(bd, true)) : std::vector<int64_t>{};
    ThreadBudget budget(ctx.num_threads());
    dnnl_.init(dnnl_desc(ad, *dt, as), dnnl_desc(bd, *dt, bs), dnnl_desc(yd, *dt), 1.0f, false);
  }

  void run(KernelContext& ctx) override {
    const TensorView* a = ctx.input(0);
    const TensorView* b = ctx.input(1);
    if (!a || !b || a->dims != a_dims_ || b->dims != b_dims_) prepare(ctx);
    TensorView& y = ctx.output(0, d_.y_dims);
    if (dnnl_.ready()) {
      ThreadBudget budget(ctx.num_threads());
      dnnl_.execute(ctx, a->data, b->data, y.data);
      return;
    }
    dispatch_numeric(a->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      std::vector<T> at, bt;
      if (ta_) at = transposed_copy(a->as<T>(), a->dims);
      if (tb_) bt = transposed_copy(b->as<T>(), b->dims);
      matmul_reference<T>(d_, ta_ ? at.data() : a->as<T>(), tb_ ? bt.data() : b->as<T>(),
                          y.as<T>(), ctx);
    });
  }

 private:
  std::string where_;
  bool ta_ = false, tb_ = false;
  MatMulDims d_;
  std::vector<int64_t> a_dims_, b_dims_;
  DnnlMatmul dnnl_;
};

// ---------------------------------------------------------------- MatMulInteger

void infer_matmul_integer(InferenceContext& ctx) {
  infer_matmul(ctx);
  ctx.output_types[0].dtype = DataType::kInt32;
}

int32_t int8_value(const TensorView& t, int64_t i, const std::string& where) {
  switch (t.dtype) {
    case DataType::kUInt8:
      return t.as<uint8_t>()[i];
    case DataType::kInt8:
      return t.as<int8_t>()[i];
    default:
      fail(where, ": dtype ", graph::dtype_short_name(t.dtype), " not supported (int8/uint8)");
  }
}

// a: (..., M, K) u8/i8, b: (..., K, N) u8/i8, a_zero_point: scalar or (M), b_zero_point: scalar
//   or (N) -> y: (..., M, N) i32. Exact in the int32 reference loop.
class MatMulIntegerKernel final : public Kernel {
 public:
  explicit MatMulIntegerKernel(const graph::Node& node) : where_(node.describe()) {}

  void run(KernelContext& ctx) override {
    const TensorView* a = ctx.input(0);
    const TensorView* b = ctx.input(1);
    OT_CHECK(a && b, where_, ": inputs A and B are required");
    MatMulDims d = matmul_dims(a->dims, b->dims, where_);
    // Zero points: one value, or one per row of A / column of B.
    auto shifted = [&](const TensorView& v, const TensorView* zp, int64_t per, bool by_column) {
      const int64_t count = zp ? zp->numel() : 0;
      OT_CHECK(count <= 1 || count == per, where_, ": zero point has ", count,
               " entries, expected 1 or ", per);
      std::vector<int32_t> out(static_cast<size_t>(v.numel()));
      for (int64_t i = 0; i < v.numel(); ++i) {
        int64_t at = count <= 1 ? 0 : by_column ? i % per : (i / d.k) % per;
        out[i] = int8_value(v, i, where_) - (count ? int8_value(*zp, at, where_) : 0);
      }
      return out;
    };
    std::vector<int32_t> as = shifted(*a, ctx.input(2), d.m, false);
    std::vector<int32_t> bs = shifted(*b, ctx.input(3), d.n, true);
    TensorView& y = ctx.output(0, d.y_dims);
    matmul_reference<int32_t>(d, as.data(), bs.data(), y.as<int32_t>(), ctx);
  }

 private:
  std::string where_;
};

// ---------------------------------------------------------------- gradients
// Both rules emit standard Gemm/MatMul/Transpose nodes, so the backward pass runs on the same
// oneDNN kernels as the forward one. They need operand ranks (known after inference), never
// dims.

// y = alpha * A' B' + beta * C with A' = transA ? A^T : A (B' likewise).
//   dA' = alpha dY B'^T, dB' = alpha A'^T dY; a transposed operand takes the transpose.
void gemm_grad(GradientBuilder& b) {
  const graph::Node& n = b.node();
  const float alpha = n.attr_float("alpha", 1.0f), beta = n.attr_float("beta", 1.0f);
  const bool ta = n.attr_int("transA", 0) != 0, tb = n.attr_int("transB", 0) != 0;
  graph::Value* dy = b.output_grad(0);
  auto gemm = [&](graph::Value* p, graph::Value* q, bool tp, bool tq) {
    return b.emit1("Gemm", {p, q},
                   {graph::Attribute::make_float("alpha", alpha),
                    graph::Attribute::make_int("transA", tp), graph::Attribute::make_int("transB", tq)});
  };
  if (b.needs_input_grad(0)) {
    // ta=0: dY B'^T; ta=1: (dY B'^T)^T = B' dY^T.
    b.set_input_grad(0, ta ? gemm(b.input(1), dy, tb, true) : gemm(dy, b.input(1), false, !tb));
  }
  if (b.needs_input_grad(1)) {
    // tb=0: A'^T dY; tb=1: (A'^T dY)^T = dY^T A'.
    b.set_input_grad(1, tb ? gemm(dy, b.input(0), true, ta) : gemm(b.input(0), dy, !ta, false));
  }
  if (b.num_inputs() > 2 && b.input(2) && b.needs_input_grad(2)) {
    graph::Value* dc = dy;
    if (beta != 1.0f) dc = b.emit1("Mul", {dy, ew::scalar_like(b, b.input(0), beta, "beta")});
    b.set_input_grad(2, b.emit1("SumToShapeOf", {dc, b.input(2)}, {}, kOnnxtrainDomain));
  }
}

int64_t static_rank(const GradientBuilder& b, int i) {
  const graph::Value* v = b.input(i);
  OT_CHECK(v->shape(), b.node().describe(), ": the MatMul gradient needs the rank of '", v->name(),
           "', which is unknown");
  return static_cast<int64_t>(v->shape()->size());
}

graph::Value* unsqueeze(GradientBuilder& b, graph::Value* x, int64_t axis) {
  if (b.opset() >= 13) {
    graph::Value* axes = b.constant(
        graph::Tensor::from_vector(DataType::kInt64, {1}, std::vector<int64_t>{axis}), "axes");
    return b.emit1("Unsqueeze", {x, axes});
  }
  return b.emit1("Unsqueeze", {x}, {graph::Attribute::make_ints("axes", {axis})});
}

// x of rank r >= 2 with its last two dims swapped.
graph::Value* transpose_last2(GradientBuilder& b, graph::Value* x, int64_t r) {
  std::vector<int64_t> perm(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) perm[i] = i;
  std::swap(perm[r - 2], perm[r - 1]);
  return b.emit1("Transpose", {x}, {graph::Attribute::make_ints("perm", perm)});
}

// numpy matmul: 1-D operands are promoted (A: (K) -> (1,K), B: (K) -> (K,1)) and dY gets the
// dropped dim back; dA = dY B^T and dB = A^T dY over the batch, summed back over the batch
// dims broadcasting added (SumToShapeOf, whose numpy rule also drops the promoted 1).
void matmul_grad(GradientBuilder& b) {
  const int64_t ra = static_rank(b, 0), rb = static_rank(b, 1);
  graph::Value* a = b.input(0);
  graph::Value* bm = b.input(1);
  graph::Value* dy = b.output_grad(0);
  if (ra == 1 && rb == 1) {  // dot product: dY is a scalar
    if (b.needs_input_grad(0)) b.set_input_grad(0, b.emit1("Mul", {dy, bm}));
    if (b.needs_input_grad(1)) b.set_input_grad(1, b.emit1("Mul", {dy, a}));
    return;
  }
  const int64_t ry = std::max(ra, rb) - ((ra == 1 || rb == 1) ? 1 : 0);
  graph::Value* g = dy;  // (..., M, N)
  if (ra == 1) g = unsqueeze(b, g, ry - 1);
  if (rb == 1) g = unsqueeze(b, g, ry);
  const int64_t rg = std::max<int64_t>(std::max(ra, rb), 2);
  const bool plain = ra == 2 && rb == 2;  // no batch: results already have the operand shapes
  auto reduce_to = [&](graph::Value* full, graph::Value* like) {
    return plain ? full : b.emit1("SumToShapeOf", {full, like}, {}, kOnnxtrainDomain);
  };
  if (b.needs_input_grad(0)) {
    graph::Value* bp = rb == 1 ? unsqueeze(b, bm, 1) : bm;                 // (..., K, N)
    graph::Value* da = b.emit1("MatMul", {g, transpose_last2(b, bp, std::max<int64_t>(rb, 2))});
    b.set_input_grad(0, reduce_to(da, a));                                 // (..., M, K)
  }
  if (b.needs_input_grad(1) && ra >= 3 && rb == 2 && b.opset() >= 11) {
    // A weight shared over A's batch dims (a transformer's Linear, [..., M, K] x [K, N]):
    // dB = A^T dY over all rows at once, one Gemm on the flattened operands. The batched form
    // transposed A ([16, 128, 1024] -> [16, 1024, 128] on BERT), multiplied per batch with an
    // inner dim of M and summed a [batch, K, N] intermediate back to [K, N].
    graph::Value* a2 = b.emit1("Flatten", {a}, {graph::Attribute::make_int("axis", ra - 1)});
    graph::Value* g2 = b.emit1("Flatten", {g}, {graph::Attribute::make_int("axis", ra - 1)});
    b.set_input_grad(1, b.emit1("Gemm", {a2, g2}, {graph::Attribute::make_int("transA", 1)}));
  } else if (b.needs_input_grad(1)) {
    graph::Value* db;
    if (rb == 1) {  // (..., 1, M) x (..., M, K) -> (..., 1, K), which sums to (K)
      graph::Value* ap = ra == 1 ? unsqueeze(b, a, 0) : a;
      db = b.emit1("MatMul", {transpose_last2(b, g, rg), ap});
    } else {
      graph::Value* ap = ra == 1 ? unsqueeze(b, a, 0) : a;                 // (..., M, K)
      db = b.emit1("MatMul", {transpose_last2(b, ap, std::max<int64_t>(ra, 2)), g});
    }
    b.set_input_grad(1, reduce_to(db, bm));
  }
}

}  // namespace

ONNXTRAIN_REGISTER_OP(nn_matmul_integer) {
  OpSchema s;
  s.op_type = "MatMulInteger";
  s.infer = infer_matmul_integer;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<MatMulIntegerKernel>(n); };
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_gemm) {
  OpSchema s;
  s.op_type = "Gemm";
  s.infer = infer_gemm;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<GemmKernel>(n); };
  s.gradient = gemm_grad;
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_matmul) {
  OpSchema s;
  s.op_type = "MatMul";
  s.infer = infer_matmul;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<MatMulKernel>(n); };
  s.gradient = matmul_grad;
  return s;
}

// MatMul reading A and/or B transposed in their last two dims (transA, transB; ONNX Runtime's
// com.microsoft FusedMatMul without alpha): what passes::fold_transposes makes of a MatMul fed
// by such a Transpose. Training graphs only (after autodiff): no gradient rule; no CUDA kernel
// (the Trainer does not run the pass for CUDA devices).
ONNXTRAIN_REGISTER_OP(nn_fused_matmul) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "FusedMatMul";
  s.infer = infer_matmul;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<MatMulKernel>(n); };
  return s;
}

}  // namespace onnxtrain::ops::nn
