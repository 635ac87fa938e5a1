// Conv and ai.onnxtrain.ConvGrad on cuDNN (legacy API), 1-D/2-D/3-D NCHW (1-D runs as 2-D with a
// unit axis): groups, strides, dilations, explicit and auto pads. cuDNN pads both ends of an axis
// alike; unequal begin/end pads (SAME_UPPER with an odd total, say) use cuDNN's pads when the end
// pad is never reached, else x is copied into a zero-padded scratch buffer that cuDNN convolves
// unpadded (dX is then computed padded and cropped). Algorithms are chosen once per plan in
// prepare() by cuDNN's heuristics.
//
// Dtypes (ops/precision.h's conv_compute_dtype): float32 throughout; or mixed precision's bf16 /
// f16 activations (X, dY, Y, dX) with W of that dtype or float32. cuDNN takes one data type per
// call, so a float32 W is rounded to the low dtype into scratch (nearest even, as the CPU reads
// it) and cuDNN runs its PSEUDO_HALF / PSEUDO_BFLOAT16 configuration (low data, float32
// accumulation, tensor-core math); a float32 dW is computed in the low dtype into scratch and
// widened. The bias and dB are own kernels in float32 / double (dB in W's dtype). Other pairs
// fall back to the CPU kernel.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ops/cuda/cuda_common.h"
#include "ops/cuda/dnn_geometry.h"
#include "ops/cuda/dnn_util.cuh"
#include "ops/cuda/eltwise_util.cuh"
#include "ops/nn/blocked_layout.h"
#include "ops/precision.h"

namespace onnxtrain::ops::cuda {
namespace {

// Largest workspace an algorithm may ask for; heuristics' later (slower) choices need less.
constexpr size_t kWorkspaceCap = size_t{1} << 30;

class FilterDesc {
 public:
  FilterDesc() { OT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc_)); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(desc_); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  void set(cudnnDataType_t dtype, const std::vector<int64_t>& dims) {
    std::vector<int> d(dims.begin(), dims.end());
    OT_CUDNN_CHECK(cudnnSetFilterNdDescriptor(desc_, dtype, CUDNN_TENSOR_NCHW,
                                              static_cast<int>(d.size()), d.data()));
  }
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class ConvDesc {
 public:
  ConvDesc() { OT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc_)); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(desc_); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return desc_; }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

// Scratch pieces start 256-byte aligned.
size_t align256(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// A tensor `small` placed at `offset` inside a larger `big` one, both row-major, rank <= 5.
struct PadMap {
  int rank = 0;
  int64_t small[5] = {}, big[5] = {}, offset[5] = {};
};

// small: (dims small) -> big: (dims big) = small at offset, zeros around it. U: the elements'
// unsigned storage type (all-zero bits are +0 in float32, bf16 and f16).
template <typename U>
__global__ void pad_kernel(PadMap g, const U* small, U* big, int64_t total) {
  OT_GRID_STRIDE_LOOP(i, total) {
    int64_t rest = i, at = 0, scale = 1;
    bool inside = true;
    for (int a = g.rank - 1; a >= 0; --a) {
      const int64_t c = rest % g.big[a] - g.offset[a];
      rest /= g.big[a];
      inside = inside && c >= 0 && c < g.small[a];
      at += c * scale;
      scale *= g.small[a];
    }
    big[i] = inside ? small[at] : U{0};
  }
}

// big: (dims big) -> small: (dims small) = the window of big at offset; U as for pad_kernel
template <typename U>
__global__ void crop_kernel(PadMap g, const U* big, U* small, int64_t total) {
  OT_GRID_STRIDE_LOOP(i, total) {
    int64_t rest = i, at = 0, scale = 1;
    for (int a = g.rank - 1; a >= 0; --a) {
      at += (rest % g.small[a] + g.offset[a]) * scale;
      rest /= g.small[a];
      scale *= g.big[a];
    }
    small[i] = big[at];
  }
}

// y: (N,M,inner) bf16 / f16, b: (M) in W's dtype -> y = y + b[m], added in float32 and rounded
// once more to T
template <typename T, typename B>
__global__ void bias_add_kernel(T* y, const B* b, int64_t total, int64_t m, int64_t inner) {
  OT_GRID_STRIDE_LOOP(i, total) {
    const int64_t c = (i / inner) % m;
    y[i] = narrow<T>(widen(y[i]) + widen(b[c]));
  }
}

// dy: (N,M,inner) bf16 / f16 -> db: (M) in W's dtype = the sum over N and inner, accumulated in
// double and rounded once; grid: one block of dnn::kReduceThreads per channel
template <typename T, typename B>
__global__ void bias_grad_kernel(const T* dy, B* db, int64_t n, int64_t m, int64_t inner) {
  __shared__ double shared[dnn::kReduceThreads];
  const int64_t c = blockIdx.x, count = n * inner;
  double s = 0;
  for (int64_t j = threadIdx.x; j < count; j += dnn::kReduceThreads)
    s += static_cast<double>(widen(dy[((j / inner) * m + c) * inner + j % inner]));
  s = dnn::block_sum(s, shared);
  if (threadIdx.x == 0) db[c] = narrow<B>(s);
}

// Float math: FMA only when TF32 is off (cuDNN 9 would otherwise use TF32 for float).
cudnnMathType_t conv_math_type() {
  return tf32_enabled() ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

// Everything the three cuDNN convolution directions share: descriptors of x (N,C,D...),
// w (M,C/g,K...), y (N,M,O...), the convolution, and a float32 bias (1,M,1...) descriptor.
struct ConvProblem {
  std::string where;
  std::vector<int64_t> x_dims, w_dims, y_dims;  // 1-D promoted to 2-D
  int64_t m = 0;
  // The activations' dtype (X, dY, Y, dX), which cuDNN's descriptors carry (W's included):
  // float32, or bf16 / f16 (mixed precision). W's own dtype is act or float32 (then rounded into
  // scratch).
  DataType act = DataType::kFloat, w_dtype = DataType::kFloat;
  // Pads cuDNN cannot express: cuDNN's x (descriptor `x`) is a zero-padded copy (padded_dims)
  // holding the user's x at pad_offsets.
  bool explicit_pad = false;
  std::vector<int64_t> padded_dims, pad_offsets;
  TensorDesc x, y, bias;
  FilterDesc w;
  ConvDesc conv;

  bool low() const { return act != DataType::kFloat; }
  // W (and dW) are float32 around low activations: rounded into scratch (dW widened from it).
  bool convert_w() const { return low() && w_dtype == DataType::kFloat; }
  size_t act_bytes() const { return low() ? 2 : sizeof(float); }

  // Sets act and w_dtype from X and W (ops/precision.h's conv_compute_dtype, the pairs cuDNN
  // runs here): all float32, or X bf16 / f16 with W of that dtype or float32. `like_x` (dY) must
  // have X's dtype, `like_w` (B) W's. DeviceFallback for the rest (X float32 around a low W,
  // double, bf16 with f16): the CPU kernel computes or reports them.
  void set_dtypes(const TensorView& xv, const TensorView& wv,
                  std::initializer_list<const TensorView*> like_x, const TensorView* like_w) {
    act = xv.dtype;
    w_dtype = wv.dtype;
    bool ok = act == DataType::kFloat
                  ? w_dtype == DataType::kFloat
                  : is_low_dtype(act) && (w_dtype == act || w_dtype == DataType::kFloat);
    for (const TensorView* t : like_x) ok = ok && (!t || t->dtype == act);
    ok = ok && (!like_w || like_w->dtype == w_dtype);
    if (!ok)
      throw DeviceFallback{where +
                           ": CUDA Conv handles float32, or bf16 / f16 activations (dY "
                           "X's dtype) with a weight (and bias) of their dtype or float32; got X " +
                           std::string(graph::dtype_short_name(act)) + ", W " +
                           std::string(graph::dtype_short_name(w_dtype))};
  }

  // A cuDNN query of prepare(): a failure is an error for float32 as before, while a bf16 / f16
  // problem cuDNN turns down (bf16 needs sm_80) falls back to the CPU kernel.
  void check_query(cudnnStatus_t st, const char* what) const {
    if (st == CUDNN_STATUS_SUCCESS) return;
    if (low()) throw DeviceFallback{where + ": cuDNN " + what + ": " + cudnnGetErrorString(st)};
    fail("cuDNN error in ", what, ": ", cudnnGetErrorString(st));
  }

  // Throws DeviceFallback for what cuDNN (or this file) does not handle. set_dtypes() first.
  void init(const graph::Node& node, const TensorView& xv, const TensorView& wv) {
    if (xv.rank() < 3 || xv.rank() > 5 || wv.rank() != xv.rank())
      throw DeviceFallback{where + ": CUDA Conv handles 1-D to 3-D convolutions"};
    const int64_t group = node.attr_int("group", 1);
    m = wv.dims[0];
    if (group < 1 || xv.dims[1] != wv.dims[1] * group || m % group != 0)
      throw DeviceFallback{where + ": channels do not match the group (the CPU kernel reports it)"};
    std::vector<int64_t> kernel(wv.dims.begin() + 2, wv.dims.end());
    WindowPlan p = plan_window(node, xv.dims, kernel, m, where);
    x_dims = xv.dims;
    w_dims = wv.dims;
    y_dims = p.y_dims;
    // cuDNN pads both ends by pad_begin; that is exact when it yields the planned output size
    // (the end pad is then never reached). A window wider than cuDNN's padded input (SAME_UPPER
    // 3x3 s2 on a 2x2 map: in 2, pads 0/1) is not: C++ division truncates the negative span to
    // 0, which would look like a match, and cuDNN rejects it.
    explicit_pad = false;
    for (size_t a = 0; a < p.in.size(); ++a) {
      const int64_t extent = (p.kernel[a] - 1) * p.dilations[a] + 1;
      const int64_t span = p.in[a] + 2 * p.pad_begin[a] - extent;
      const bool symmetric_ok = span >= 0 && span / p.strides[a] + 1 == p.out[a];
      explicit_pad |= p.pad_begin[a] != p.pad_end[a] && !symmetric_ok;
    }
    std::vector<int> pads, strides, dilations;
    padded_dims = x_dims;
    pad_offsets.assign(x_dims.size(), 0);
    for (size_t a = 0; a < p.in.size(); ++a) {
      for (int64_t v : {p.pad_begin[a], p.strides[a], p.dilations[a]})
        dnn::require_int(where, v, "window attribute");
      pads.push_back(explicit_pad ? 0 : static_cast<int>(p.pad_begin[a]));
      strides.push_back(static_cast<int>(p.strides[a]));
      dilations.push_back(static_cast<int>(p.dilations[a]));
      padded_dims[a + 2] += p.pad_begin[a] + p.pad_end[a];
      pad_offsets[a + 2] = p.pad_begin[a];
    }
    if (pads.size() == 1) {  // 1-D: a trailing unit axis
      for (auto* v : {&x_dims, &w_dims, &y_dims, &padded_dims}) v->push_back(1);
      pad_offsets.push_back(0);
      pads.push_back(0);
      strides.push_back(1);
      dilations.push_back(1);
    }
    // TensorDesc's strides are int: a tensor of more than INT_MAX elements would wrap them.
    for (const auto* v : {&x_dims, &w_dims, &y_dims, &padded_dims}) {
      for (int64_t d : *v) dnn::require_int(where, d, "dim");
      dnn::require_int(where, dnn::product(*v), "element count");
    }
    if (dnn::product(x_dims) == 0 || dnn::product(w_dims) == 0 || dnn::product(y_dims) == 0)
      throw DeviceFallback{where + ": empty tensor"};
    // bf16 / f16 data with a float32 compute type: cuDNN's PSEUDO_BFLOAT16 / PSEUDO_HALF
    // configurations (products accumulated in float32, each output rounded once).
    const cudnnDataType_t data = cudnn_dtype(act, where);
    x.set(data, explicit_pad ? padded_dims : x_dims);
    y.set(data, y_dims);
    std::vector<int64_t> b_dims(y_dims.size(), 1);
    b_dims[1] = m;
    bias.set(CUDNN_DATA_FLOAT, b_dims);
    w.set(data, w_dims);
    OT_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor(conv.get(), static_cast<int>(pads.size()),
                                                   pads.data(), strides.data(), dilations.data(),
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    OT_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), static_cast<int>(group)));
    OT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), query_math()));
    // cuDNN's own output size must be the plan's (guards the pad reasoning above).
    std::vector<int> out(y_dims.size());
    OT_CUDNN_CHECK(cudnnGetConvolutionNdForwardOutputDim(conv.get(), x.get(), w.get(),
                                                         static_cast<int>(out.size()), out.data()));
    if (std::vector<int64_t>(out.begin(), out.end()) != y_dims)
      throw DeviceFallback{where + ": cuDNN output size differs from the planned one"};
  }

  // First heuristic result (fastest first) that succeeded, fits the cap and is deterministic,
  // so that a rerun (a resumed training) repeats its gradients bit for bit; else the first that
  // fits.
  template <typename Perf>
  Perf pick(const Perf* perf, int count, const char* direction) const {
    auto fits = [&](int i) {
      return perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= kWorkspaceCap;
    };
    for (int i = 0; i < count; ++i)
      if (fits(i) && perf[i].determinism == CUDNN_DETERMINISTIC) return perf[i];
    for (int i = 0; i < count; ++i)
      if (fits(i)) return perf[i];
    throw DeviceFallback{where + ": cuDNN has no " + direction + " algorithm for this convolution"};
  }

  // Bytes of the zero-padded x copy (0 when cuDNN pads).
  size_t padded_bytes() const {
    return explicit_pad ? static_cast<size_t>(dnn::product(padded_dims)) * act_bytes() : 0;
  }

  // Bytes of W (or dW) rounded to the low dtype (0 unless convert_w()).
  size_t low_w_bytes() const {
    return convert_w() ? static_cast<size_t>(dnn::product(w_dims)) * act_bytes() : 0;
  }

  // The float32 W -> `low`: (M,C/g,K...) in act, rounded to nearest even
  void round_w(cudaStream_t s, const void* wv, void* low) const {
    convert_floats(wv, DataType::kFloat, low, act, dnn::product(w_dims), s);
  }

  PadMap pad_map() const {
    PadMap g;
    g.rank = static_cast<int>(x_dims.size());
    for (int a = 0; a < g.rank; ++a) {
      g.small[a] = x_dims[a];
      g.big[a] = padded_dims[a];
      g.offset[a] = pad_offsets[a];
    }
    return g;
  }

  // x -> padded: (padded_dims)
  void pad(cudaStream_t s, const void* xv, void* padded) const {
    const int64_t total = dnn::product(padded_dims);
    dispatch_width(act_bytes(), [&]<typename U>() {
      pad_kernel<U><<<blocks_for(total), 256, 0, s>>>(pad_map(), static_cast<const U*>(xv),
                                                      static_cast<U*>(padded), total);
      OT_CUDA_CHECK_LAUNCH();
    });
  }

  // padded: (padded_dims) -> its x-shaped window
  void crop(cudaStream_t s, const void* padded, void* xv) const {
    const int64_t total = dnn::product(x_dims);
    dispatch_width(act_bytes(), [&]<typename U>() {
      crop_kernel<U><<<blocks_for(total), 256, 0, s>>>(pad_map(), static_cast<const U*>(padded),
                                                       static_cast<U*>(xv), total);
      OT_CUDA_CHECK_LAUNCH();
    });
  }

  // The math type the heuristics are asked with: float32 as conv_math_type(); bf16 / f16 on
  // tensor cores.
  cudnnMathType_t query_math() const { return low() ? CUDNN_TENSOR_OP_MATH : conv_math_type(); }

  // The math type an algorithm was ranked with (bf16 / f16, or float32 with TF32 on), else FMA
  // only.
  void use_math(cudnnMathType_t ranked) {
    OT_CUDNN_CHECK(
        cudnnSetConvolutionMathType(conv.get(), low() || tf32_enabled() ? ranked : CUDNN_FMA_MATH));
  }

  // Calls g.template operator()<T, B>() with T the low activation type and B W's element type
  // (float, or T). Only when low().
  template <typename G>
  void dispatch_low(G&& g) const {
    dispatch_types(LowT{}, act, [&]<typename T>() {
      if (w_dtype == DataType::kFloat)
        g.template operator()<T, float>();
      else
        g.template operator()<T, T>();
    });
  }

  // Elements per channel of y: the product of y_dims past (N, M).
  int64_t y_inner() const {
    int64_t inner = 1;
    for (size_t a = 2; a < y_dims.size(); ++a) inner *= y_dims[a];
    return inner;
  }
};

// x: (N,C,D...), w: (M,C/g,K...), b: (M) -> y: (N,M,O...)
class ConvKernel final : public Kernel {
 public:
  explicit ConvKernel(const graph::Node& node) { p_.where = node.describe(); }

  void prepare(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    const TensorView* w = ctx.input(1);
    const TensorView* b = ctx.input(2);
    if (!x || !w) throw DeviceFallback{p_.where + ": inputs X and W are required"};
    p_.set_dtypes(*x, *w, {}, b);
    if (b && (b->rank() != 1 || b->dims[0] != w->dims[0]))
      throw DeviceFallback{p_.where + ": bias shape (the CPU kernel reports it)"};
    p_.init(ctx.node(), *x, *w);
    has_bias_ = b != nullptr;
    cudnnHandle_t h = cudnn_handle(stream_of(ctx));
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    p_.check_query(
        cudnnGetConvolutionForwardAlgorithm_v7(h, p_.x.get(), p_.w.get(), p_.conv.get(), p_.y.get(),
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf),
        "cudnnGetConvolutionForwardAlgorithm_v7");
    const auto chosen = p_.pick(perf, count, "forward");
    algo_ = chosen.algo;
    p_.use_math(chosen.mathType);
    p_.check_query(cudnnGetConvolutionForwardWorkspaceSize(h, p_.x.get(), p_.w.get(), p_.conv.get(),
                                                           p_.y.get(), algo_, &workspace_),
                   "cudnnGetConvolutionForwardWorkspaceSize");
  }

  void run(KernelContext& ctx) override {
    cudaStream_t s = stream_of(ctx);
    cudnnHandle_t h = cudnn_handle(s);
    TensorView& y = ctx.output(0);
    // Scratch: [workspace | padded x | W rounded to the low dtype]
    const size_t ws_bytes = align256(workspace_), x_bytes = align256(p_.padded_bytes());
    const size_t total = ws_bytes + x_bytes + p_.low_w_bytes();
    char* scratch = total ? static_cast<char*>(ctx.scratch(total)) : nullptr;
    void* ws = workspace_ ? scratch : nullptr;
    const void* x = ctx.input(0)->data;
    if (p_.explicit_pad) {
      p_.pad(s, x, scratch + ws_bytes);
      x = scratch + ws_bytes;
    }
    const void* w = ctx.input(1)->data;
    if (p_.convert_w()) {
      p_.round_w(s, w, scratch + ws_bytes + x_bytes);
      w = scratch + ws_bytes + x_bytes;
    }
    // Float32 scaling factors in every configuration used here (float32 compute type).
    const float one = 1.0f, zero = 0.0f;
    OT_CUDNN_CHECK(cudnnConvolutionForward(h, &one, p_.x.get(), x, p_.w.get(), w, p_.conv.get(),
                                           algo_, ws, workspace_, &zero, p_.y.get(), y.data));
    if (!has_bias_) return;
    if (!p_.low()) {
      OT_CUDNN_CHECK(
          cudnnAddTensor(h, &one, p_.bias.get(), ctx.input(2)->data, &one, p_.y.get(), y.data));
      return;
    }
    const int64_t n = dnn::product(p_.y_dims);
    p_.dispatch_low([&]<typename T, typename B>() {
      bias_add_kernel<T, B><<<blocks_for(n), 256, 0, s>>>(static_cast<T*>(y.data),
                                                          static_cast<const B*>(ctx.input(2)->data),
                                                          n, p_.m, p_.y_inner());
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  ConvProblem p_;
  bool has_bias_ = false;
  cudnnConvolutionFwdAlgo_t algo_{};
  size_t workspace_ = 0;
};

// dy: (N,M,O...), x: (N,C,D...), w: (M,C/g,K...) -> dx: (N,C,D...), dw: (M,C/g,K...), db: (M),
// each computed only when requested (the node's outputs are a prefix of dX, dW, dB; an emptied
// slot is not requested).
class ConvGradKernel final : public Kernel {
 public:
  explicit ConvGradKernel(const graph::Node& node) { p_.where = node.describe(); }

  void prepare(KernelContext& ctx) override {
    const TensorView* dy = ctx.input(0);
    const TensorView* x = ctx.input(1);
    const TensorView* w = ctx.input(2);
    if (!dy || !x || !w) throw DeviceFallback{p_.where + ": inputs dY, X and W are required"};
    p_.set_dtypes(*x, *w, {dy}, nullptr);
    p_.init(ctx.node(), *x, *w);
    std::vector<int64_t> dy_dims = dy->dims;
    if (dy_dims.size() == 3) dy_dims.push_back(1);
    if (dy_dims != p_.y_dims) throw DeviceFallback{p_.where + ": dY shape (the CPU reports it)"};
    want_dx_ = ctx.has_output(0);
    want_dw_ = ctx.has_output(1);
    want_db_ = ctx.has_output(2);
    cudnnHandle_t h = cudnn_handle(stream_of(ctx));
    size_t data_ws = 0, filter_ws = 0;
    if (want_dx_) {
      p_.use_math(p_.query_math());
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      int count = 0;
      p_.check_query(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                         h, p_.w.get(), p_.y.get(), p_.conv.get(), p_.x.get(),
                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf),
                     "cudnnGetConvolutionBackwardDataAlgorithm_v7");
      const auto chosen = p_.pick(perf, count, "backward-data");
      data_algo_ = chosen.algo;
      data_math_ = chosen.mathType;
      p_.use_math(data_math_);
      p_.check_query(
          cudnnGetConvolutionBackwardDataWorkspaceSize(h, p_.w.get(), p_.y.get(), p_.conv.get(),
                                                       p_.x.get(), data_algo_, &data_ws),
          "cudnnGetConvolutionBackwardDataWorkspaceSize");
    }
    if (want_dw_) {
      p_.use_math(p_.query_math());
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      int count = 0;
      p_.check_query(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                         h, p_.x.get(), p_.y.get(), p_.conv.get(), p_.w.get(),
                         CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf),
                     "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
      const auto chosen = p_.pick(perf, count, "backward-filter");
      filter_algo_ = chosen.algo;
      filter_math_ = chosen.mathType;
      p_.use_math(filter_math_);
      p_.check_query(
          cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p_.x.get(), p_.y.get(), p_.conv.get(),
                                                         p_.w.get(), filter_algo_, &filter_ws),
          "cudnnGetConvolutionBackwardFilterWorkspaceSize");
    }
    workspace_ = std::max(data_ws, filter_ws);  // the two run one after the other
  }

  void run(KernelContext& ctx) override {
    cudaStream_t s = stream_of(ctx);
    cudnnHandle_t h = cudnn_handle(s);
    const void* dy = ctx.input(0)->data;
    // Scratch: [workspace | padded x (for dW) | padded dX | low W (for dX) | low dW]; the padded
    // pieces only when cuDNN cannot pad, the low ones only for a float32 W around bf16 / f16.
    const size_t ws_bytes = align256(workspace_);
    const size_t x_bytes = want_dw_ ? align256(p_.padded_bytes()) : 0;
    const size_t dx_bytes = want_dx_ ? align256(p_.padded_bytes()) : 0;
    const size_t w_bytes = want_dx_ ? align256(p_.low_w_bytes()) : 0;
    const size_t dw_bytes = want_dw_ ? p_.low_w_bytes() : 0;
    const size_t total = ws_bytes + x_bytes + dx_bytes + w_bytes + dw_bytes;
    char* scratch = total ? static_cast<char*>(ctx.scratch(total)) : nullptr;
    void* ws = workspace_ ? scratch : nullptr;
    char* const padded_x = scratch + ws_bytes;
    char* const padded_dx = padded_x + x_bytes;
    char* const low_w = padded_dx + dx_bytes;
    char* const low_dw = low_w + w_bytes;
    // Float32 scaling factors in every configuration used here (float32 compute type).
    const float one = 1.0f, zero = 0.0f;
    if (want_dx_) {
      p_.use_math(data_math_);
      const void* w = ctx.input(2)->data;
      if (p_.convert_w()) {
        p_.round_w(s, w, low_w);
        w = low_w;
      }
      void* dx = ctx.output(0).data;
      void* target = p_.explicit_pad ? padded_dx : dx;
      OT_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, p_.w.get(), w, p_.y.get(), dy,
                                                  p_.conv.get(), data_algo_, ws, workspace_, &zero,
                                                  p_.x.get(), target));
      if (p_.explicit_pad) p_.crop(s, target, dx);
    }
    if (want_dw_) {
      p_.use_math(filter_math_);
      const void* x = ctx.input(1)->data;
      if (p_.explicit_pad) {
        p_.pad(s, x, padded_x);
        x = padded_x;
      }
      void* dw = ctx.output(1).data;
      OT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
          h, &one, p_.x.get(), x, p_.y.get(), dy, p_.conv.get(), filter_algo_, ws, workspace_,
          &zero, p_.w.get(), p_.convert_w() ? low_dw : dw));
      // A float32 dW from the low one cuDNN wrote (exact: float32 holds every bf16 / f16).
      if (p_.convert_w())
        convert_floats(low_dw, p_.act, dw, DataType::kFloat, dnn::product(p_.w_dims), s);
    }
    if (!want_db_) return;
    if (!p_.low()) {
      OT_CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &one, p_.y.get(), dy, &zero, p_.bias.get(),
                                                  ctx.output(2).data));
      return;
    }
    p_.dispatch_low([&]<typename T, typename B>() {
      bias_grad_kernel<T, B><<<static_cast<unsigned>(p_.m), dnn::kReduceThreads, 0, s>>>(
          static_cast<const T*>(dy), static_cast<B*>(ctx.output(2).data), p_.y_dims[0], p_.m,
          p_.y_inner());
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  ConvProblem p_;
  bool want_dx_ = false, want_dw_ = false, want_db_ = false;
  cudnnConvolutionBwdDataAlgo_t data_algo_{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo_{};
  cudnnMathType_t data_math_ = CUDNN_DEFAULT_MATH, filter_math_ = CUDNN_DEFAULT_MATH;
  size_t workspace_ = 0;
};

}  // namespace

// passes::block_layout's port marks (ops/nn/blocked_layout.h: oneDNN's CPU layouts) are not
// implemented here: such nodes run the CPU kernels on host copies (the pass does not run for
// CUDA devices).
namespace {
void refuse_blocked_ports(const graph::Node& n) {
  for (const char* a : {kXBlockedAttr, kYBlockedAttr, kDyBlockedAttr, kDxBlockedAttr})
    if (n.attr_int(a, 0)) throw DeviceFallback{n.describe() + ": blocked layout (" + a + ")"};
}
}  // namespace

ONNXTRAIN_REGISTER_KERNEL(conv_cuda, "", "Conv", kCuda) {
  refuse_blocked_ports(n);
  return std::make_unique<ConvKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(conv_grad_cuda, kOnnxtrainDomain, "ConvGrad", kCuda) {
  refuse_blocked_ports(n);
  // Nor is grad_dtype (dW float32 around a kept bf16 weight copy, passes::keep_weight_copies).
  if (n.find_attr(kGradDtypeAttr))
    throw DeviceFallback{n.describe() + ": " + kGradDtypeAttr + " (a kept weight copy)"};
  return std::make_unique<ConvGradKernel>(n);
}

}  // namespace onnxtrain::ops::cuda
