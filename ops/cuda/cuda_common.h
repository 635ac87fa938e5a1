// What every CUDA kernel file shares: error checks that become onnxtrain Errors, the per-thread
// cuBLAS/cuDNN handles bound to the running step's stream, launch sizing, and the process-wide
// TF32 switch. Included only by sources compiled when the CUDA backend is on (ops/cuda/*.cu).
//
// Contract with the runtime (runtime/step_context.h, plan_exec.cc): a CUDA kernel runs on the
// replica's compute stream (KernelContext::stream()); every input/output/scratch pointer it sees
// is device memory of the current device (the runtime calls cudaSetDevice before a run); kernels
// enqueue work on that stream and never synchronize it. Values a kernel needs on the host (a
// Reshape target, axes) come from KernelContext::host_constant(i) (constant inputs only).
// prepare() runs once per plan with dims known and data pointers not yet valid.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <vector>

#include "graph/error.h"
#include "ops/op_api.h"

namespace onnxtrain::ops::cuda {

#define OT_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    cudaError_t ot_cuda_err_ = (expr);                                                        \
    if (ot_cuda_err_ != cudaSuccess)                                                          \
      ::onnxtrain::fail("CUDA error in ", #expr, ": ", cudaGetErrorString(ot_cuda_err_));     \
  } while (0)

#define OT_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                        \
    cublasStatus_t ot_cublas_st_ = (expr);                                                    \
    if (ot_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::onnxtrain::fail("cuBLAS error in ", #expr, ": ", cublasGetStatusString(ot_cublas_st_)); \
  } while (0)

#define OT_CUDNN_CHECK(expr)                                                                  \
  do {                                                                                        \
    cudnnStatus_t ot_cudnn_st_ = (expr);                                                      \
    if (ot_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                                 \
      ::onnxtrain::fail("cuDNN error in ", #expr, ": ", cudnnGetErrorString(ot_cudnn_st_));   \
  } while (0)

// Checks the last kernel launch (call right after <<<...>>>).
#define OT_CUDA_CHECK_LAUNCH() OT_CUDA_CHECK(cudaGetLastError())

inline cudaStream_t stream_of(const KernelContext& ctx) {
  return static_cast<cudaStream_t>(ctx.stream());
}

// This thread's handle for the current device, bound to `stream` (created on first use, kept
// for the thread's lifetime). cuBLAS math mode follows tf32_enabled().
cublasHandle_t cublas_handle(cudaStream_t stream);
cudnnHandle_t cudnn_handle(cudaStream_t stream);

// TF32 tensor-core math for float32 matmul/conv (default on; --no-tf32 turns it off).
bool tf32_enabled();
void set_tf32_enabled(bool on);

// Blocks for a 1-D grid-stride launch over n elements.
inline unsigned blocks_for(int64_t n, unsigned threads = 256) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 16) b = 65535LL * 16;  // grid-stride loops cover the rest
  return static_cast<unsigned>(b);
}

// cuDNN tensor descriptor (RAII) for an N-d float tensor in packed NCHW... layout; dims of rank
// < 4 are padded with trailing 1s (cuDNN wants at least 4).
class TensorDesc {
 public:
  TensorDesc();
  ~TensorDesc();
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  void set(cudnnDataType_t dtype, const std::vector<int64_t>& dims);
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

// DataType -> cudnnDataType_t (float, double, half, bfloat16); throws for others.
cudnnDataType_t cudnn_dtype(DataType dtype, const std::string& where);

}  // namespace onnxtrain::ops::cuda
