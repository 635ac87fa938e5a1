// Shared CUDA plumbing (cuda_common.h).
#include "ops/cuda/cuda_common.h"

#include "ops/cuda_arch.h"

#include <atomic>
#include <map>
#include <string>

namespace onnxtrain::ops::cuda {
namespace {

std::atomic<bool> g_tf32{true};

struct ThreadHandles {
  std::map<int, cublasHandle_t> cublas;  // by device
  std::map<int, cudnnHandle_t> cudnn;
  ~ThreadHandles() {
    // Handles die with the thread; errors at teardown are ignored (the context may be gone).
    for (auto& [d, h] : cublas) cublasDestroy(h);
    for (auto& [d, h] : cudnn) cudnnDestroy(h);
  }
};

ThreadHandles& handles() {
  thread_local ThreadHandles h;
  return h;
}

// ops/cuda_arch.h's probe: every kernel of ops/cuda is compiled for the same architectures.
__global__ void probe_kernel(int* p) {
  if (p) *p = 0;
}

int current_device() {
  int d = 0;
  OT_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

}  // namespace

bool tf32_enabled() { return g_tf32.load(std::memory_order_relaxed); }
void set_tf32_enabled(bool on) { g_tf32.store(on, std::memory_order_relaxed); }

cublasHandle_t cublas_handle(cudaStream_t stream) {
  auto& map = handles().cublas;
  const int dev = current_device();
  auto it = map.find(dev);
  if (it == map.end()) {
    cublasHandle_t h = nullptr;
    OT_CUBLAS_CHECK(cublasCreate(&h));
    it = map.emplace(dev, h).first;
  }
  OT_CUBLAS_CHECK(cublasSetStream(it->second, stream));
  OT_CUBLAS_CHECK(cublasSetMathMode(
      it->second, tf32_enabled() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  return it->second;
}

cudnnHandle_t cudnn_handle(cudaStream_t stream) {
  auto& map = handles().cudnn;
  const int dev = current_device();
  auto it = map.find(dev);
  if (it == map.end()) {
    cudnnHandle_t h = nullptr;
    OT_CUDNN_CHECK(cudnnCreate(&h));
    it = map.emplace(dev, h).first;
  }
  OT_CUDNN_CHECK(cudnnSetStream(it->second, stream));
  return it->second;
}

TensorDesc::TensorDesc() { OT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_)); }
TensorDesc::~TensorDesc() {
  if (desc_) cudnnDestroyTensorDescriptor(desc_);
}

void TensorDesc::set(cudnnDataType_t dtype, const std::vector<int64_t>& dims) {
  std::vector<int> d(dims.begin(), dims.end());
  while (d.size() < 4) d.push_back(1);
  std::vector<int> strides(d.size());
  int s = 1;
  for (size_t i = d.size(); i-- > 0;) {
    strides[i] = s;
    s *= d[i];
  }
  OT_CUDNN_CHECK(cudnnSetTensorNdDescriptor(desc_, dtype, static_cast<int>(d.size()), d.data(),
                                            strides.data()));
}

cudnnDataType_t cudnn_dtype(DataType dtype, const std::string& where) {
  switch (dtype) {
    case DataType::kFloat: return CUDNN_DATA_FLOAT;
    case DataType::kDouble: return CUDNN_DATA_DOUBLE;
    case DataType::kFloat16: return CUDNN_DATA_HALF;
    case DataType::kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: fail(where, ": dtype ", graph::dtype_short_name(dtype), " is not supported on CUDA");
  }
}

}  // namespace onnxtrain::ops::cuda

namespace onnxtrain::ops {

bool cuda_kernels_load(int device) {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, cuda::probe_kernel);
  cudaGetLastError();  // a missing image is not sticky; clear it either way
  cudaSetDevice(previous);
  return e == cudaSuccess;
}

}  // namespace onnxtrain::ops
