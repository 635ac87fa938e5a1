// The CUDA device (device.h): one GPU, one non-blocking compute stream, a caching allocator over
// cudaMalloc. Compiled only with the CUDA backend.
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "graph/error.h"
#include "ops/cuda_arch.h"
#include "ops/precision.h"
#include "runtime/device/device.h"

namespace onnxtrain::runtime {
namespace {

void check(cudaError_t e, const std::string& where, const char* what) {
  if (e != cudaSuccess) fail(where, ": ", what, ": ", cudaGetErrorString(e));
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index)
      : index_(index),
        name_("cuda:" + std::to_string(index)),
        alloc_([this](size_t n) { return raw_alloc(n); }, [](void* p) { cudaFree(p); }, name_) {
    check(cudaSetDevice(index_), name_, "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), name_, "cudaStreamCreate");
    check(cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, index_), name_,
          "compute capability");
    check(cudaDeviceGetAttribute(&cc_minor_, cudaDevAttrComputeCapabilityMinor, index_), name_,
          "compute capability");
    if (!ops::cuda_kernels_load(index_)) {
      const std::string cc = std::to_string(cc_major_) + "." + std::to_string(cc_minor_);
      fail(name_, ": this build's CUDA kernels do not load on this GPU (compute capability ", cc,
           "; built for ", ops::describe_cuda_archs(ops::cuda_built_archs()),
           "): rebuild with -DCMAKE_CUDA_ARCHITECTURES=", cc_major_, cc_minor_,
           " (or =native on this machine), or run with --device cpu");
    }
  }
  ~CudaDevice() override {
    cudaSetDevice(index_);
    if (stream_) cudaStreamSynchronize(stream_);
    alloc_.release_cache();
    if (stream_) cudaStreamDestroy(stream_);
  }
  std::string name() const override { return name_; }
  int index() const override { return index_; }
  ops::DeviceKind kind() const override { return ops::DeviceKind::kCuda; }
  bool host_memory() const override { return false; }
  bool runs_natively(graph::DataType t) const override {
    return ops::cuda_runs_natively(t, cc_major_);
  }
  std::string native_requirement(graph::DataType t) const override {
    return std::string(ops::cuda_native_requirement(t)) + "; this GPU is " +
           std::to_string(cc_major_) + "." + std::to_string(cc_minor_);
  }
  void activate() override { check(cudaSetDevice(index_), name_, "cudaSetDevice"); }
  void* stream() const override { return stream_; }
  void* allocate(size_t bytes) override { return alloc_.allocate(bytes); }
  void deallocate(void* p) override { alloc_.deallocate(p); }
  void to_device(void* dst, const void* src, size_t n) override {
    if (n) check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_), name_, "copy to device");
  }
  void to_host(void* dst, const void* src, size_t n) override {
    if (n) check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_), name_, "copy to host");
    synchronize();
  }
  void on_device(void* dst, const void* src, size_t n) override {
    if (n && dst != src)
      check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_), name_, "device copy");
  }
  // A kernel's asynchronous failure surfaces here (or at the next copy to the host).
  void synchronize() override { check(cudaStreamSynchronize(stream_), name_, "a queued kernel failed"); }
  AllocatorStats memory_stats() const override { return alloc_.stats(); }

 private:
  void* raw_alloc(size_t n) {
    void* p = nullptr;
    if (cudaMalloc(&p, n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky out-of-memory error; the allocator retries or throws
      return nullptr;
    }
    return p;
  }
  int index_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  int cc_major_ = 0, cc_minor_ = 0;
  CachingAllocator alloc_;
};

}  // namespace

std::shared_ptr<Device> make_cuda_device(int index) { return std::make_shared<CudaDevice>(index); }

int cuda_device_count_impl() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver / no GPU: report none
    return 0;
  }
  return n;
}

}  // namespace onnxtrain::runtime
