// Where a session's tensors live and its kernels run. The CPU device is the default: buffers are
// host memory and every kernel is the op's CPU kernel. A CUDA device (one GPU and one compute
// stream, per replica) keeps the plan's arena, constants, inputs and training state in GPU memory
// from a caching allocator and runs the ops' CUDA kernels on its stream; a node without a CUDA
// kernel runs its CPU kernel with inputs and outputs staged through host memory. The "sim" device
// is a test double with that staging behaviour on the CPU (see make_device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/dtype.h"
#include "ops/op_api.h"
#include "runtime/device/caching_allocator.h"

namespace onnxtrain::runtime {

class Device : public std::enable_shared_from_this<Device> {
 public:
  virtual ~Device() = default;
  // "cpu", "cuda:0", "sim".
  virtual std::string name() const = 0;
  // The GPU's index (cuda:N); 0 elsewhere.
  virtual int index() const { return 0; }
  // Which kernels it runs natively.
  virtual ops::DeviceKind kind() const = 0;
  // Whether its kernels compute float type t natively (ops/precision.h): mixed precision refuses
  // the others unless the user allows emulation.
  virtual bool runs_natively(graph::DataType t) const = 0;
  // What runs_natively(t) needs and this device lacks, for the refusal's message.
  virtual std::string native_requirement(graph::DataType t) const = 0;
  // True when buffers are host memory a CPU kernel reads directly (no staging).
  virtual bool host_memory() const = 0;
  // Makes the device current on the calling thread (cudaSetDevice); every run starts with it.
  virtual void activate() {}
  // The compute stream kernels enqueue on (cudaStream_t; nullptr on the CPU).
  virtual void* stream() const { return nullptr; }
  // The kernel for `node` on this device, or nullptr when it runs its CPU kernel instead
  // (no device kernel, or the factory threw ops::DeviceFallback).
  virtual std::unique_ptr<ops::Kernel> device_kernel(const ops::OpSchema& schema,
                                                     const graph::Node& node) const;

  // Device memory (caching). Freed blocks are reused by later work on the same stream.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  // A buffer that returns itself to this device when the last copy goes.
  std::shared_ptr<std::byte> make_buffer(size_t bytes);

  // Host -> device, queued on the stream; `src` may be reused when it returns.
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  // Device -> host; returns when the bytes are in `dst` (waits for queued work).
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
  // Device -> device, queued on the stream.
  virtual void on_device(void* dst, const void* src, size_t bytes) = 0;
  // Waits for every queued operation; throws the first asynchronous error.
  virtual void synchronize() {}
  virtual AllocatorStats memory_stats() const { return {}; }
};

// The host: buffers are host memory, kernels are CPU kernels.
std::shared_ptr<Device> cpu_device();

// "cpu" | "cuda" (= cuda:0) | "cuda:N" | "sim". A CUDA device gets its own compute stream. Throws
// Error naming the spec when it is malformed, when the build has no CUDA backend, or when GPU N
// does not exist. "sim" (tests): host memory the plan must treat as device memory (every value
// staged as on a GPU), running the CUDA-less ops' CPU kernels "natively" for every second op
// type, so both native and staged paths run.
std::shared_ptr<Device> make_device(const std::string& spec);

// GPUs the CUDA driver reports (0 without a driver, a GPU or a CUDA build).
int cuda_device_count();
// True when the build includes the CUDA backend (ONNXTRAIN_WITH_CUDA).
bool cuda_built();
// The default device spec for tools: "cuda" when a GPU is present, else "cpu".
std::string default_device_spec();

// --precision's names (fp32, bf16, fp16), for onnxtrain and onnxrun.
std::string precision_name(graph::DataType t);
std::optional<graph::DataType> parse_precision(std::string_view name);
// Why `device` would not compute float type t natively -- the refusal onnxtrain and onnxrun
// print for --precision without --allow-emulation (a CPU without AVX512-BF16/AMX would run the
// reference loops, far slower than fp32) -- or "" when it would.
std::string precision_refusal(const Device& device, graph::DataType t);
// TF32 tensor-core math for float32 matmul/conv in CUDA kernels (default on); no-op without CUDA.
void set_cuda_tf32(bool on);

// A tensor held in a device's memory (training state kept on the GPU between steps).
struct DeviceTensor {
  graph::DataType dtype = graph::DataType::kUndefined;
  std::vector<int64_t> dims;
  size_t nbytes = 0;
  std::shared_ptr<std::byte> data;
};

}  // namespace onnxtrain::runtime
