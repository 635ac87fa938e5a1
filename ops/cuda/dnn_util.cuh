// Shared pieces of the cuDNN/cuBLAS kernels (matmul.cu, conv.cu, batch_norm.cu, pool.cu): dtype
// and size guards that turn unhandled cases into DeviceFallback, the cuBLAS compute type, a
// block-wide double sum for the block-per-row reductions, and a grid-stride loop helper.
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/cuda/cuda_common.h"

namespace onnxtrain::ops::cuda::dnn {

// Throws DeviceFallback unless every given tensor exists and is float32.
inline void require_f32(const std::string& where, std::initializer_list<const TensorView*> ts) {
  for (const TensorView* t : ts)
    if (t && t->dtype != DataType::kFloat)
      throw DeviceFallback{where + ": CUDA kernel handles float32 only, got " +
                           std::string(graph::dtype_short_name(t->dtype))};
}

// cuBLAS/cuDNN take int sizes; larger problems run on the CPU rather than overflow.
inline bool fits_int(int64_t v) {
  return v >= 0 && v <= INT_MAX;
}

inline void require_int(const std::string& where, int64_t v, const char* what) {
  if (!fits_int(v))
    throw DeviceFallback{where + ": " + what + " " + std::to_string(v) + " exceeds int range"};
}

inline int64_t product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

// float32 GEMM compute type: TF32 tensor cores unless --no-tf32.
inline cublasComputeType_t gemm_compute_type() {
  return tf32_enabled() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// Threads of the block-per-row reductions (a power of two: block_sum halves it).
constexpr int kReduceThreads = 256;

// Sum of v over the block (blockDim.x == kReduceThreads), returned to every thread; every thread
// of the block must call it. `shared` holds kReduceThreads doubles.
__device__ inline double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kReduceThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();  // shared is reused by the next call
  return total;
}

// for (int64_t i : grid-stride range over [0, n)) inside a 1-D launch.
#define OT_GRID_STRIDE_LOOP(i, n)                                                        \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

}  // namespace onnxtrain::ops::cuda::dnn
