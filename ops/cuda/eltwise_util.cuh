// Device helpers shared by the elementwise, shape, reduction, loss and optimizer CUDA kernels:
// a strided index map (numpy broadcasting, Transpose, Expand all become one), dtype helpers and
// the host-side checks that turn unsupported cases into ops::DeviceFallback.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "graph/bfloat16.h"
#include "ops/cuda/cuda_common.h"

namespace onnxtrain::ops::cuda {

inline constexpr int kMaxRank = 8;
inline constexpr int kMaxOperands = 3;
inline constexpr unsigned kThreads = 256;

// Output dims (row-major, collapsed) and, per operand, element strides (0 on broadcast dims).
// Passed to kernels by value.
struct StridedMap {
  int rank = 1;
  int64_t dims[kMaxRank] = {1};
  int64_t strides[kMaxOperands][kMaxRank] = {};
  int64_t total = 0;
};

// Offset of operand k for output element i (host-callable too, for checks).
__host__ __device__ __forceinline__ int64_t map_offset(const StridedMap& m, int k, int64_t i) {
  if (m.rank == 1) return i * m.strides[k][0];
  int64_t off = 0;
  for (int d = m.rank - 1; d >= 0; --d) {
    const int64_t q = i / m.dims[d];
    off += (i - q * m.dims[d]) * m.strides[k][d];
    i = q;
  }
  return off;
}

// Row-major strides of dims.
inline std::vector<int64_t> row_major_strides(std::span<const int64_t> dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t d = dims.size(); d-- > 1;) s[d - 1] = s[d] * dims[d];
  return s;
}

// Strides that read `in` (right-aligned against out_rank dims) with 0 on axes of size 1.
inline std::vector<int64_t> broadcast_strides(std::span<const int64_t> in, size_t out_rank) {
  std::vector<int64_t> s(out_rank, 0);
  const std::vector<int64_t> rs = row_major_strides(in);
  const size_t lead = out_rank - in.size();
  for (size_t k = 0; k < in.size(); ++k) s[lead + k] = in[k] == 1 ? 0 : rs[k];
  return s;
}

// numpy broadcast of several dims lists into `out`; false when they do not broadcast.
inline bool broadcast_dims_of(const std::vector<std::vector<int64_t>>& operands,
                              std::vector<int64_t>& out) {
  size_t rank = 0;
  for (const auto& d : operands) rank = std::max(rank, d.size());
  out.assign(rank, 1);
  for (const auto& d : operands) {
    const size_t lead = rank - d.size();
    for (size_t k = 0; k < d.size(); ++k) {
      const int64_t v = d[k];
      int64_t& o = out[lead + k];
      if (v == o || v == 1) continue;
      if (o == 1) {
        o = v;
        continue;
      }
      return false;
    }
  }
  return true;
}

// Builds the map for output dims `out` and per-operand strides (each of out.size() entries).
// Size-1 dims are dropped and adjacent dims merged where every operand stays linear across them,
// so same-shape operands collapse to one contiguous dim. Throws DeviceFallback past kMaxRank.
inline StridedMap make_map(std::span<const int64_t> out,
                           const std::vector<std::vector<int64_t>>& strides) {
  StridedMap m;
  const size_t nops = strides.size();
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> st(nops);
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    bool merge = !dims.empty();
    for (size_t k = 0; merge && k < nops; ++k) merge = st[k].back() == strides[k][d] * out[d];
    if (merge) {
      dims.back() *= out[d];
      for (size_t k = 0; k < nops; ++k) st[k].back() = strides[k][d];
    } else {
      dims.push_back(out[d]);
      for (size_t k = 0; k < nops; ++k) st[k].push_back(strides[k][d]);
    }
  }
  if (dims.empty()) {
    dims.push_back(1);
    for (size_t k = 0; k < nops; ++k) st[k].push_back(0);
  }
  if (dims.size() > static_cast<size_t>(kMaxRank))
    throw DeviceFallback{"rank above 8 after collapsing dims"};
  m.rank = static_cast<int>(dims.size());
  m.total = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    m.dims[d] = dims[d];
    m.total *= dims[d];
    for (size_t k = 0; k < nops; ++k) m.strides[k][d] = st[k][d];
  }
  for (int64_t d : out) {
    if (d == 0) m.total = 0;
  }
  return m;
}

// The map of numpy-broadcasting `operands` onto their broadcast dims (written to out_dims).
inline StridedMap broadcast_map(const std::vector<std::vector<int64_t>>& operands,
                                std::vector<int64_t>& out_dims) {
  if (!broadcast_dims_of(operands, out_dims))
    throw DeviceFallback{"inputs do not broadcast (the CPU kernel reports it)"};
  std::vector<std::vector<int64_t>> strides;
  for (const auto& d : operands) strides.push_back(broadcast_strides(d, out_dims.size()));
  return make_map(out_dims, strides);
}

// Same dims helper for run()-time checks against the plan.
inline void check_dims(const TensorView& v, std::span<const int64_t> expect,
                       const graph::Node& node, const char* what) {
  OT_CHECK(std::equal(v.dims.begin(), v.dims.end(), expect.begin(), expect.end()), node.describe(),
           ": planned ", what, " dims differ from the dims prepare() computed");
}

// Input i or DeviceFallback when omitted.
inline const TensorView& need_input(const KernelContext& ctx, int i) {
  const TensorView* v = ctx.input(i);
  if (!v) throw DeviceFallback{cat("input ", i, " is missing")};
  return *v;
}

inline bool is_one_of(DataType t, std::initializer_list<DataType> list) {
  return std::find(list.begin(), list.end(), t) != list.end();
}

// DeviceFallback unless `t` is in `list`.
inline void need_dtype(DataType t, std::initializer_list<DataType> list, const char* what) {
  if (!is_one_of(t, list))
    throw DeviceFallback{
        cat(what, " dtype ", graph::dtype_short_name(t), " is not handled on CUDA")};
}

// Integer values of a host-constant int32/int64 tensor; DeviceFallback for other dtypes (the
// CPU kernel reports them) instead of reading their bytes as int32.
inline std::vector<int64_t> host_ints(const TensorView& v) {
  need_dtype(v.dtype, {DataType::kInt64, DataType::kInt32}, "shape-like input");
  std::vector<int64_t> out(static_cast<size_t>(v.numel()));
  for (size_t k = 0; k < out.size(); ++k)
    out[k] = v.dtype == DataType::kInt64 ? v.as<int64_t>()[k] : v.as<int32_t>()[k];
  return out;
}

// Device-to-device copy of nbytes on the kernel's stream (skipped when src == dst or empty).
inline void copy_async(void* dst, const void* src, size_t nbytes, cudaStream_t s) {
  if (nbytes == 0 || dst == src) return;
  OT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s));
}

// Compile-time dtype lists: an op names the element types it runs on CUDA; anything else falls
// back to the CPU kernel.
template <typename... T>
struct Types {};

template <typename T>
struct DTypeOf;
#define OT_CUDA_DTYPE(T, D)                        \
  template <>                                      \
  struct DTypeOf<T> {                              \
    static constexpr DataType value = DataType::D; \
  }
OT_CUDA_DTYPE(float, kFloat);
OT_CUDA_DTYPE(double, kDouble);
OT_CUDA_DTYPE(int8_t, kInt8);
OT_CUDA_DTYPE(int16_t, kInt16);
OT_CUDA_DTYPE(int32_t, kInt32);
OT_CUDA_DTYPE(int64_t, kInt64);
OT_CUDA_DTYPE(uint8_t, kUInt8);
OT_CUDA_DTYPE(bool, kBool);
OT_CUDA_DTYPE(__half, kFloat16);
OT_CUDA_DTYPE(__nv_bfloat16, kBFloat16);
#undef OT_CUDA_DTYPE

template <typename... T>
bool has_dtype(Types<T...>, DataType dt) {
  return ((dt == DTypeOf<T>::value) || ...);
}

// Calls g.template operator()<T>() for the T in the list whose dtype is `dt`; false if none.
template <typename... T, typename G>
bool dispatch_types(Types<T...>, DataType dt, G&& g) {
  return ((dt == DTypeOf<T>::value ? (g.template operator()<T>(), true) : false) || ...);
}

using FloatT = Types<float, double>;
using ArithT = Types<float, double, int32_t, int64_t>;

// ---------------------------------------------------------------- low precision (--precision)
// bf16 and f16 kernels follow the CPU's rule (ops/precision.h, ops/elementwise/dtypes.h): read
// the low-precision elements as float32, compute in float32, round the result once to nearest
// even. Only the ops passes::autocast keeps in low precision take them.
using LowT = Types<__half, __nv_bfloat16>;

template <typename T>
inline constexpr bool kIsLow = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

inline bool is_low_dtype(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16;
}

// The float32 a kernel computes with: a low-precision element widened, any other type as is.
template <typename T>
__host__ __device__ __forceinline__ auto widen(T v) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return v;
}

// A float32 result stored as T: rounded once to nearest even for the low types (bf16 by
// graph/bfloat16.h, the CPU's rule bit for bit, NaN payloads included).
template <typename T, typename F>
__host__ __device__ __forceinline__ T narrow(F v) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __ushort_as_bfloat16(graph::bf16_from_float(static_cast<float>(v)));
  else
    return static_cast<T>(v);
}

// Op over float32 for low-precision operands: widen every input, call op, round the result to
// Out once (the map kernel stores it as is).
template <typename Out, typename Op>
struct InFloat {
  Op op;
  template <typename... In>
  __device__ Out operator()(In... in) const {
    return narrow<Out>(op(widen(in)...));
  }
};

// Elementwise conversion of n elements between float32 / float64 and bf16 / f16 (any pair of
// those), rounding to nearest even as narrow() does (not Cast's truncating bf16). Defined in
// cast.cu; the cuDNN kernels use it for a convolution's float32 weight and its gradient.
void convert_floats(const void* in, DataType from, void* out, DataType to, int64_t n,
                    cudaStream_t s);

// Unsigned storage type of an element width (ops that only move elements).
template <int kBytes>
struct Storage;
template <>
struct Storage<1> {
  using type = uint8_t;
};
template <>
struct Storage<2> {
  using type = uint16_t;
};
template <>
struct Storage<4> {
  using type = uint32_t;
};
template <>
struct Storage<8> {
  using type = uint64_t;
};

// Calls g.template operator()<U>() with U the unsigned type of `bytes`, or DeviceFallback.
template <typename G>
void dispatch_width(size_t bytes, G&& g) {
  switch (bytes) {
    case 1:
      return g.template operator()<uint8_t>();
    case 2:
      return g.template operator()<uint16_t>();
    case 4:
      return g.template operator()<uint32_t>();
    case 8:
      return g.template operator()<uint64_t>();
    default:
      throw DeviceFallback{cat("element width ", bytes, " bytes is not handled on CUDA")};
  }
}

// Element width in bytes of a fixed-size dtype, or DeviceFallback (strings, packed 4-bit).
inline size_t elem_bytes(DataType t) {
  const int bits = graph::dtype_bits(t);
  if (t == DataType::kString || bits < 8 || bits % 8 != 0)
    throw DeviceFallback{cat("dtype ", graph::dtype_short_name(t), " is not handled on CUDA")};
  return static_cast<size_t>(bits / 8);
}

// out[i] = in[map(i)]: Transpose, Expand and broadcast copies. U: unsigned storage type.
template <typename U>
__global__ void strided_gather_kernel(StridedMap m, const U* __restrict__ in, U* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m.total;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = in[map_offset(m, 0, i)];
}

// out[map(i)] = in[i]: writes a contiguous tensor into a strided window (SliceGrad).
template <typename U>
__global__ void strided_scatter_kernel(StridedMap m, const U* __restrict__ in,
                                       U* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m.total;
       i += int64_t{gridDim.x} * blockDim.x)
    out[map_offset(m, 0, i)] = in[i];
}

inline void launch_strided_scatter(const StridedMap& m, size_t bytes, const void* in, void* out,
                                   cudaStream_t s) {
  if (m.total == 0) return;
  dispatch_width(bytes, [&]<typename U>() {
    strided_scatter_kernel<U><<<blocks_for(m.total, kThreads), kThreads, 0, s>>>(
        m, static_cast<const U*>(in), static_cast<U*>(out));
    OT_CUDA_CHECK_LAUNCH();
  });
}

inline void launch_strided_gather(const StridedMap& m, size_t bytes, const void* in, void* out,
                                  cudaStream_t s) {
  if (m.total == 0) return;
  dispatch_width(bytes, [&]<typename U>() {
    strided_gather_kernel<U><<<blocks_for(m.total, kThreads), kThreads, 0, s>>>(
        m, static_cast<const U*>(in), static_cast<U*>(out));
    OT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace onnxtrain::ops::cuda

namespace onnxtrain::ops::cuda {

// Tree reduction of one value per thread over a block of exactly kThreads threads; every thread
// gets the result. The order is fixed, so results do not vary between runs. T must be trivially
// constructible (it lives in static shared memory).
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T buf[kThreads];
  const unsigned t = threadIdx.x;
  buf[t] = v;
  __syncthreads();
  for (unsigned half = kThreads / 2; half > 0; half /= 2) {
    if (t < half) buf[t] = op(buf[t], buf[t + half]);
    __syncthreads();
  }
  const T out = buf[0];
  __syncthreads();  // the buffer may be reused by the next call
  return out;
}

// Grid size for one block per item (grid-stride beyond 2^31 - 1 items).
inline unsigned blocks_per_item(int64_t items) {
  return static_cast<unsigned>(std::clamp<int64_t>(items, 1, 0x7fffffff));
}

// x, y: lanes [outer, n, inner]; softmax (log-softmax when `log`) along n with the CPU's
// numerics (max subtracted, sum in double); y may alias x. Defined in reduce.cu (float, double).
template <typename T>
void launch_softmax(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log,
                    cudaStream_t s);

// ---------------------------------------------------------------- the one map kernel

template <typename F, typename... In, size_t... K>
__device__ __forceinline__ auto call_at(const StridedMap& m, const F& f, int64_t i,
                                        std::index_sequence<K...>, const In*... in) {
  return f(in[map_offset(m, static_cast<int>(K), i)]...);
}

// y[i] = f(in_0[map_0(i)], ..) over m.total elements. y may alias an operand whose map is the
// identity (each thread reads index i before writing it).
template <typename Out, typename F, typename... In>
__global__ void map_kernel(StridedMap m, F f, Out* y, const In*... in) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m.total;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = static_cast<Out>(call_at(m, f, i, std::index_sequence_for<In...>{}, in...));
}

template <typename Out, typename F, typename... In>
void launch_map(const StridedMap& m, const F& f, cudaStream_t s, Out* y, const In*... in) {
  if (m.total == 0) return;
  const unsigned blocks = blocks_for(m.total, kThreads);
  map_kernel<Out, F, In...><<<blocks, kThreads, 0, s>>>(m, f, y, in...);
  OT_CUDA_CHECK_LAUNCH();
}

inline StridedMap contiguous_map(int64_t n, int operands) {
  StridedMap m;
  m.dims[0] = n;
  for (int k = 0; k < operands; ++k) m.strides[k][0] = 1;
  m.total = n;
  return m;
}

}  // namespace onnxtrain::ops::cuda
