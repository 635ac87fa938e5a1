// Shared pieces of the nn op family (Conv, ConvTranspose, pools, BatchNormalization, Gemm,
// MatMul): window attributes and output-size rules, oneDNN engine/threading glue, dtype dispatch.
#pragma once

#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/elementwise/dtypes.h"
#include "ops/op_api.h"
#include "ops/precision.h"

namespace onnxtrain::ops::nn {

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

// The sliding-window attributes of Conv / ConvTranspose / MaxPool / AveragePool, read once from
// the node and validated against the spatial rank. pads are ONNX order: all begins, then ends.
struct WindowAttrs {
  std::vector<int64_t> kernel, strides, dilations, pads;
  AutoPad auto_pad = AutoPad::kNotSet;
  bool ceil_mode = false;
};

// kernel_from_weights: the weight's spatial dims (Conv/ConvTranspose), used when kernel_shape is
// absent and checked against it when present; nullopt for pools (kernel_shape required).
WindowAttrs read_window_attrs(const graph::Node& n, size_t spatial_rank,
                              const std::optional<std::vector<int64_t>>& kernel_from_weights,
                              const std::string& where);

// One spatial axis resolved against its input size: output size and the pads actually applied.
struct AxisWindow {
  int64_t out = -1;
  int64_t pad_begin = 0, pad_end = 0;
};

// Conv and pools: explicit pads, SAME_UPPER/SAME_LOWER (out = ceil(in/stride)), VALID, and
// ceil_mode (a last window that would start in the end padding is dropped, as in PyTorch/ONNX).
AxisWindow forward_axis(const WindowAttrs& a, size_t axis, int64_t in, const std::string& where);

// ConvTranspose: out = stride*(in-1) + output_padding + (k-1)*dilation + 1 - pads, or the
// requested output_shape / SAME size with the total padding split as the ONNX reference does
// (floor division, so a negative total padding extends the end).
AxisWindow transpose_axis(const WindowAttrs& a, size_t axis, int64_t in, int64_t output_padding,
                          std::optional<int64_t> output_size, const std::string& where);

// Concrete geometry of a window op over (N, C, spatial...) -> (N, M, spatial...).
struct WindowGeom {
  std::vector<int64_t> in, out, kernel, strides, dilations, pad_begin, pad_end;
  int64_t in_size = 1, out_size = 1, kernel_size = 1;  // spatial element counts
  // Appends one spatial axis of input size `in` with its window; returns its output size.
  int64_t add_axis(int64_t in, int64_t out, int64_t begin, int64_t end);
  // Kernel, strides and dilations, then the sizes.
  void finish(std::vector<int64_t> kernel_dims, std::vector<int64_t> strides_,
              std::vector<int64_t> dilations_);
  void finish();                                       // computes the sizes
};

// A tap of a window: flat kernel index and flat spatial input index.
struct Tap {
  int64_t k, i;
};
// Forward window (input = out*stride - pad_begin + k*dilation) of output position o, keeping taps
// inside the input; `transposed` instead gathers ConvTranspose's (out + pad_begin - k*dilation) /
// stride where divisible.
void collect_taps(const WindowGeom& g, int64_t o, bool transposed, std::vector<Tap>& taps);

// ---------------------------------------------------------------- oneDNN glue

const dnnl::engine& cpu_engine();

// oneDNN's float32 GEMM (dnnl_sgemm, and the "gemm:jit" convolution and matmul implementations
// built on it) generates its JIT kernels on the first call in the process, not when a primitive
// is created: ~28 ms on AVX-512 that used to land inside training step 1 (ResNet-50 64² b16:
// first step 1.2-1.3x a steady one). Kernels call this from prepare() when they will run such a
// GEMM (`impl`: the primitive's impl_info_str(), or "gemm:jit" for a direct dnnl_sgemm user):
// the first call runs one tiny sgemm, later ones return at once.
void warm_gemm_kernels(std::string_view impl, dnnl::memory::data_type compute);

// oneDNN (OpenMP build) sizes its parallel regions from the calling thread's OpenMP ICV
// (omp_get_max_threads), not from the runtime's intra-op budget. Replica executors each hold a
// share of the cores, so the budget is applied to this thread's ICV around primitive creation
// (some implementations fix their work split there) and execution, then restored.
class ThreadBudget {
 public:
  explicit ThreadBudget(int threads);
  ~ThreadBudget();
  ThreadBudget(const ThreadBudget&) = delete;
  ThreadBudget& operator=(const ThreadBudget&) = delete;

 private:
  int previous_;
};

// Row-major matrix products for kernels that multiply plain buffers (LSTM / GRU / RNN, Einsum):
// oneDNN's sgemm for float32 within the node's thread budget, a plain loop for float64.
// C[m, n] (+)= sum_k A[m, k] B[n, k] (B transposed), or with `a_t` A[k, m]; row-major, C
// overwritten when !accumulate.
template <typename T>
void gemm(bool a_t, int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate,
          const KernelContext& ctx, int64_t ldc = 0) {
  if (m == 0 || n == 0) return;
  if (ldc == 0) ldc = n;
  if constexpr (std::is_same_v<T, float>) {
    ThreadBudget budget(ctx.num_threads());
    OT_CHECK(dnnl_sgemm(a_t ? 'T' : 'N', 'T', m, n, k, 1.0f, a, a_t ? m : k, b, k,
                        accumulate ? 1.0f : 0.0f, c, ldc) == dnnl_success,
             "oneDNN sgemm failed");
  } else {
    ctx.parallel_for(m, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        for (int64_t j = 0; j < n; ++j) {
          T acc = accumulate ? c[i * ldc + j] : T{0};
          for (int64_t q = 0; q < k; ++q) acc += (a_t ? a[q * m + i] : a[i * k + q]) * b[j * k + q];
          c[i * ldc + j] = acc;
        }
    });
  }
}

// C[m, n] (+)= A[m, k] B[k, n] (B not transposed).
template <typename T>
void gemm_nn(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate,
             const KernelContext& ctx) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    ThreadBudget budget(ctx.num_threads());
    OT_CHECK(dnnl_sgemm('N', 'N', m, n, k, 1.0f, a, k, b, n, accumulate ? 1.0f : 0.0f, c, n) ==
                 dnnl_success,
             "oneDNN sgemm failed");
  } else {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        T acc = accumulate ? c[i * n + j] : T{0};
        for (int64_t q = 0; q < k; ++q) acc += a[i * k + q] * b[q * n + j];
        c[i * n + j] = acc;
      }
  }
}

dnnl::memory::dims to_dnnl(std::span<const int64_t> v);
// f32 (or `type`) memory desc with the given dims and row-major strides.
dnnl::memory::desc plain_desc(std::span<const int64_t> dims,
                              dnnl::memory::data_type type = dnnl::memory::data_type::f32);
// An (N, C, H, W) activation in the runtime's buffer: plain, or blocked by
// ops/nn/blocked_layout.h's rule (nChw16c / nChw8c, channel_block()).
dnnl::memory::desc activation_desc(std::span<const int64_t> dims, bool blocked,
                                   dnnl::memory::data_type type);
dnnl::memory::desc strided_desc(std::span<const int64_t> dims, std::span<const int64_t> strides);
std::vector<int64_t> row_major_strides(std::span<const int64_t> dims);

// Carves one ctx.scratch() block into 64-byte aligned pieces.
class ScratchPlan {
 public:
  size_t add(size_t bytes);  // offset of a new piece
  size_t total() const { return total_; }

 private:
  size_t total_ = 0;
};

// ---------------------------------------------------------------- misc

int64_t product(std::span<const int64_t> v);
std::string join_dims(std::span<const int64_t> v);  // "2x3x4"

// Calls f(T{}) for float / double, fails naming the node for anything else.
template <typename F>
void dispatch_float(DataType t, const std::string& where, F&& f) {
  switch (t) {
    case DataType::kFloat:
      f(float{});
      return;
    case DataType::kDouble:
      f(double{});
      return;
    default:
      fail(where, ": dtype ", graph::dtype_short_name(t), " not supported");
  }
}

// Calls f(T{}) for float / double / bfloat16 / float16 (the low-precision types as the
// elementwise family's storage types, converting through float): the loops of the ops that
// mixed precision runs in low precision (the reference loops of Conv, ConvGrad, Gemm, MatMul
// and pooling; BatchNormalization and its gradient, which compute in float and store bf16).
template <typename F>
void dispatch_float_or_low(DataType t, const std::string& where, F&& f) {
  switch (t) {
    case DataType::kBFloat16:
      f(ew::BFloat16{});
      return;
    case DataType::kFloat16:
      f(ew::Half{});
      return;
    default:
      dispatch_float(t, where, std::forward<F>(f));
  }
}

// oneDNN's data type of f32 / bf16 / f16 (nullopt for anything else): the dtypes the oneDNN
// paths of Conv, ConvGrad, Gemm and MatMul take.
std::optional<dnnl::memory::data_type> dnnl_float_type(DataType t);

// Float dtypes the shape inference of these ops accepts (the kernels support f32 and f64).
void check_float_input(const InferenceContext& ctx, size_t i);

// The oneDNN algorithm a Conv / ConvGrad / FusedConv node asks for through its conv_algorithm
// attribute (ops/nn/conv_algorithm.h): winograd, or direct when the attribute is absent. Any
// other value is an error naming the node.
dnnl::algorithm requested_conv_algorithm(const graph::Node& node);

}  // namespace onnxtrain::ops::nn
