// The CPU and simulated devices, device specs (device.h). The CUDA device is cuda_device.cc.
#include "runtime/device/device.h"

#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>

#include "graph/error.h"
#include "ops/precision.h"

namespace onnxtrain::runtime {

#if ONNXTRAIN_WITH_CUDA
}  // namespace onnxtrain::runtime
namespace onnxtrain::ops::cuda {
void set_tf32_enabled(bool on);  // ops/cuda/cuda_common.cu
}  // namespace onnxtrain::ops::cuda
namespace onnxtrain::runtime {
// cuda_device.cc
std::shared_ptr<Device> make_cuda_device(int index);
int cuda_device_count_impl();
#endif

std::unique_ptr<ops::Kernel> Device::device_kernel(const ops::OpSchema& schema,
                                                   const graph::Node& node) const {
  const ops::KernelFactory& f = kind() == ops::DeviceKind::kCuda ? schema.cuda_kernel : schema.cpu_kernel;
  if (!f) return nullptr;
  try {
    return f(node);
  } catch (const ops::DeviceFallback&) {
    return nullptr;
  }
}

std::shared_ptr<std::byte> Device::make_buffer(size_t bytes) {
  auto* p = static_cast<std::byte*>(allocate(bytes));
  std::shared_ptr<Device> self = shared_from_this();
  return std::shared_ptr<std::byte>(p, [self](std::byte* q) { self->deallocate(q); });
}

namespace {

constexpr size_t kHostAlign = 64;

void* host_alloc(size_t n) { return ::operator new[](n, std::align_val_t{kHostAlign}, std::nothrow); }
void host_free(void* p) { ::operator delete[](p, std::align_val_t{kHostAlign}); }

// Devices whose memory is host memory: every copy is a memmove. Their kernels are CPU kernels.
class HostMemoryDevice : public Device {
 public:
  bool runs_natively(graph::DataType t) const override { return ops::cpu_runs_natively(t); }
  std::string native_requirement(graph::DataType t) const override {
    return t == graph::DataType::kFloat16 ? "AVX512-FP16 with a oneDNN that has f16 kernels"
                                          : "AVX512-BF16 or AMX";
  }
  void to_device(void* dst, const void* src, size_t n) override { copy(dst, src, n); }
  void to_host(void* dst, const void* src, size_t n) override { copy(dst, src, n); }
  void on_device(void* dst, const void* src, size_t n) override { copy(dst, src, n); }

 private:
  static void copy(void* dst, const void* src, size_t n) {
    if (n && dst != src) std::memmove(dst, src, n);
  }
};

class CpuDevice final : public HostMemoryDevice {
 public:
  std::string name() const override { return "cpu"; }
  ops::DeviceKind kind() const override { return ops::DeviceKind::kCpu; }
  bool host_memory() const override { return true; }
  void* allocate(size_t bytes) override {
    void* p = host_alloc(std::max<size_t>(bytes, 1));
    OT_CHECK(p, "cpu: out of memory allocating ", bytes, " bytes");
    return p;
  }
  void deallocate(void* p) override { host_free(p); }
};

// Host memory treated as device memory: the plan stages every CPU-kernel node through host
// copies and keeps state "resident" exactly as on a GPU. Op types with an even hash run their
// CPU kernel in place as the device's own kernel, so native, staged and mixed paths all run.
class SimDevice final : public HostMemoryDevice {
 public:
  SimDevice() : alloc_(host_alloc, host_free, "sim") {}
  std::string name() const override { return "sim"; }
  ops::DeviceKind kind() const override { return ops::DeviceKind::kCpu; }
  bool host_memory() const override { return false; }
  std::unique_ptr<ops::Kernel> device_kernel(const ops::OpSchema& schema,
                                             const graph::Node& node) const override {
    if (!schema.cpu_kernel || (std::hash<std::string>{}(node.op_type) & 1)) return nullptr;
    return schema.cpu_kernel(node);
  }
  void* allocate(size_t bytes) override {
    void* p = alloc_.allocate(bytes);
    // Poison fresh blocks: a plan that reads a buffer before writing it fails the tests.
    std::memset(p, 0xA5, CachingAllocator::round_size(bytes));
    return p;
  }
  void deallocate(void* p) override { alloc_.deallocate(p); }
  AllocatorStats memory_stats() const override { return alloc_.stats(); }

 private:
  CachingAllocator alloc_;
};

}  // namespace

std::shared_ptr<Device> cpu_device() {
  static std::shared_ptr<Device> cpu = std::make_shared<CpuDevice>();
  return cpu;
}

bool cuda_built() { return ONNXTRAIN_WITH_CUDA != 0; }

int cuda_device_count() {
#if ONNXTRAIN_WITH_CUDA
  return cuda_device_count_impl();
#else
  return 0;
#endif
}

void set_cuda_tf32(bool on) {
#if ONNXTRAIN_WITH_CUDA
  ops::cuda::set_tf32_enabled(on);
#else
  (void)on;
#endif
}

std::string default_device_spec() { return cuda_device_count() > 0 ? "cuda" : "cpu"; }

std::shared_ptr<Device> make_device(const std::string& spec) {
  if (spec == "cpu" || spec == "cpu:0") return cpu_device();
  if (spec == "sim") return std::make_shared<SimDevice>();
  if (spec.rfind("cuda", 0) == 0) {
    int index = 0;
    if (spec.size() > 4) {
      OT_CHECK(spec[4] == ':' && spec.size() > 5 && spec.size() < 9 &&
                   spec.find_first_not_of("0123456789", 5) == std::string::npos,
               "device '", spec, "': expected cuda or cuda:N");
      index = std::atoi(spec.c_str() + 5);
    }
    OT_CHECK(cuda_built(), "device '", spec,
             "': this onnxtrain was built without the CUDA backend (configure with the CUDA "
             "toolkit present, or use --device cpu)");
    const int n = cuda_device_count();
    OT_CHECK(n > 0, "device '", spec, "': no CUDA GPU found (use --device cpu)");
    OT_CHECK(index < n, "device '", spec, "': only ", n, " CUDA GPU", n == 1 ? "" : "s",
             " (cuda:0..cuda:", n - 1, ")");
#if ONNXTRAIN_WITH_CUDA
    return make_cuda_device(index);
#endif
  }
  fail("device '", spec, "': expected cpu, cuda or cuda:N");
}

std::string precision_name(graph::DataType t) {
  switch (t) {
    case graph::DataType::kFloat: return "fp32";
    case graph::DataType::kBFloat16: return "bf16";
    case graph::DataType::kFloat16: return "fp16";
    default: return std::string(graph::dtype_short_name(t));
  }
}

std::optional<graph::DataType> parse_precision(std::string_view name) {
  for (graph::DataType t :
       {graph::DataType::kFloat, graph::DataType::kBFloat16, graph::DataType::kFloat16})
    if (name == precision_name(t)) return t;
  return std::nullopt;
}

std::string precision_refusal(const Device& d, graph::DataType t) {
  if (d.runs_natively(t)) return "";
  const bool cpu = d.kind() == ops::DeviceKind::kCpu;
  const std::string name = precision_name(t);
  return cat("--precision ", name, ": ", cpu ? std::string("this CPU") : d.name(),
             " has no native ", name, " ", cpu ? "instructions" : "kernels", " (",
             d.native_requirement(t), "); ",
             cpu ? "it would run the reference loops, far slower than fp32"
                 : "it would run slowly or not at all",
             " (--allow-emulation runs it anyway)");
}

}  // namespace onnxtrain::runtime
