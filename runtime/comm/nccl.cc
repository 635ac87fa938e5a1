// NcclCommunicator (runtime/comm/nccl.h) and the CUDA build's make_nccl_communicators
// (runtime/comm/nccl_factory.h).
#include "runtime/comm/nccl.h"

#include <set>
#include <string>
#include <utility>

#include "graph/error.h"
#include "runtime/comm/nccl_factory.h"

namespace onnxtrain::runtime {
namespace {

// Makes `device` current for the scope (-1: keeps it) and restores the caller's device: replica
// threads keep their own current device, and a communicator may be called from any of them.
class DeviceGuard {
 public:
  DeviceGuard(int device, int rank) {
    check_cuda(cudaGetDevice(&previous_), rank, "cudaGetDevice");
    if (device >= 0 && previous_ != device) check_cuda(cudaSetDevice(device), rank, "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }  // best effort: destructors must not throw
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// The NCCL type that ncclSum adds for `dtype`.
ncclDataType_t nccl_sum_type(DataType dtype, std::string_view what) {
  switch (dtype) {
    case DataType::kFloat: return ncclFloat32;
    case DataType::kDouble: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUInt8: return ncclUint8;
    case DataType::kInt8: return ncclInt8;
    default: break;
  }
  fail(what, ": dtype ", graph::dtype_short_name(dtype),
       " cannot be summed by NCCL (f32, f64, f16, bf16, i32, i64, u8, i8)");
}

// Byte count of `count` elements; check_comm_args has ruled out overflow.
size_t byte_size(int64_t count, DataType dtype) {
  return static_cast<size_t>(count) * static_cast<size_t>(comm_element_size(dtype, "nccl"));
}

size_t align_up(size_t n) { return (n + 255) & ~size_t{255}; }

// Every index a valid CUDA device, none twice (NCCL rejects two ranks on one GPU).
void check_devices(const std::vector<int>& devices, const char* factory) {
  OT_CHECK(!devices.empty(), "NcclCommunicator::", factory, ": no CUDA devices given");
  int available = 0;
  check_cuda(cudaGetDeviceCount(&available), -1, "cudaGetDeviceCount");
  std::set<int> seen;
  for (int d : devices) {
    OT_CHECK(d >= 0 && d < available, "NcclCommunicator::", factory, ": CUDA device ", d,
             " does not exist (this machine has ", available, ")");
    OT_CHECK(seen.insert(d).second, "NcclCommunicator::", factory, ": CUDA device ", d,
             " is listed twice (one rank per GPU)");
  }
}

// An all_reduce_async in flight: the event recorded on the comm stream after the collective.
class NcclWork final : public CommWork {
 public:
  NcclWork(cudaEvent_t event, int device, int rank) : event_(event), device_(device), rank_(rank) {}
  ~NcclWork() override { cudaEventDestroy(event_); }
  void wait() override {
    if (!finished_) {
      DeviceGuard guard(device_, rank_);
      error_ = cudaEventSynchronize(event_);
      finished_ = true;
    }
    check_cuda(error_, rank_, "all_reduce_async (wait)");
  }
  bool done() const override { return finished_ || cudaEventQuery(event_) != cudaErrorNotReady; }

 private:
  cudaEvent_t event_;
  int device_, rank_;
  bool finished_ = false;
  cudaError_t error_ = cudaSuccess;
};

}  // namespace

void check_nccl(ncclResult_t result, int rank, ncclComm_t comm, std::string_view what) {
  if (result == ncclSuccess) return;
  const char* last = ncclGetLastError(comm);
  const std::string who = rank >= 0 ? cat("NCCL rank ", rank) : std::string("NCCL");
  fail(who, ": ", what, ": ", ncclGetErrorString(result),
       last && *last ? cat(" (", last, ")") : std::string());
}

void check_cuda(cudaError_t result, int rank, std::string_view what) {
  if (result == cudaSuccess) return;
  const std::string who = rank >= 0 ? cat("NCCL rank ", rank) : std::string("NCCL");
  fail(who, ": ", what, ": CUDA error: ", cudaGetErrorString(result));
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, int device, int rank, int size)
    : comm_(comm), device_(device), rank_(rank), size_(size) {}

NcclCommunicator::~NcclCommunicator() {
  // Best effort, nothing may throw here. A communicator whose peer failed is aborted:
  // ncclCommDestroy would wait for collectives that can no longer finish.
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  ncclResult_t async_error = ncclSuccess;
  if (comm_) ncclCommGetAsyncError(comm_, &async_error);
  if (stream_ && async_error == ncclSuccess) cudaStreamSynchronize(stream_);
  if (comm_) {
    if (async_error == ncclSuccess)
      ncclCommDestroy(comm_);
    else
      ncclCommAbort(comm_);
  }
  if (staging_ && stream_) {
    cudaFreeAsync(staging_, stream_);
    cudaStreamSynchronize(stream_);
  }
  if (stream_) cudaStreamDestroy(stream_);
  cudaSetDevice(previous);
}

std::vector<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create_local(
    const std::vector<int>& cuda_devices) {
  check_devices(cuda_devices, "create_local");
  const int n = static_cast<int>(cuda_devices.size());
  DeviceGuard keep(-1, -1);  // ncclCommInitAll switches devices
  std::vector<ncclComm_t> raw(cuda_devices.size(), nullptr);
  check_nccl(ncclCommInitAll(raw.data(), n, cuda_devices.data()), -1, nullptr,
             cat("ncclCommInitAll over ", n, " GPUs"));
  // Own every comm at once, so a failure below destroys all of them.
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  out.reserve(raw.size());
  for (int k = 0; k < n; ++k)
    out.emplace_back(new NcclCommunicator(raw[static_cast<size_t>(k)],
                                          cuda_devices[static_cast<size_t>(k)], k, n));
  for (auto& c : out) {
    DeviceGuard guard(c->device_, c->rank_);
    c->check(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags");
  }
  return out;
}

std::vector<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create_world(
    ProcessWorld& world, const std::vector<int>& cuda_devices) {
  // Every process must have valid devices and agree on their count before anyone blocks in
  // NCCL's init: all see the same gathered counts (-1: invalid devices), so all raise an error.
  std::string device_error;
  try {
    check_devices(cuda_devices, "create_world");
  } catch (const Error& e) {
    device_error = e.what();
  }
  const int64_t local = device_error.empty() ? static_cast<int64_t>(cuda_devices.size()) : -1;
  std::vector<int64_t> counts(static_cast<size_t>(world.size()), 0);
  world.all_gather(&local, counts.data(), 1, DataType::kInt64, "NCCL setup (GPUs per process)");
  if (!device_error.empty()) throw WorldConsistentError(device_error);
  for (int p = 0; p < world.size(); ++p) {
    const int64_t c = counts[static_cast<size_t>(p)];
    if (c < 0)
      throw WorldConsistentError(cat("NcclCommunicator::create_world: process ", p,
                                     " was given invalid CUDA devices"));
    if (c != local)
      throw WorldConsistentError(cat("NcclCommunicator::create_world: process ", p, " drives ",
                                     c, " GPUs, process ", world.rank(), " drives ", local,
                                     " (every process needs the same number)"));
  }
  ncclUniqueId id{};
  if (world.rank() == 0) check_nccl(ncclGetUniqueId(&id), 0, nullptr, "ncclGetUniqueId");
  world.broadcast(&id, static_cast<int64_t>(sizeof(id)), DataType::kUInt8, 0,
                  "NCCL setup (unique id)");

  const int n_local = static_cast<int>(local);
  const int nranks = world.size() * n_local;
  const int base = world.rank() * n_local;
  DeviceGuard keep(-1, base);
  std::vector<ncclComm_t> raw(cuda_devices.size(), nullptr);
  // One thread joins several ranks: the inits must be one group, or the first would wait
  // for the others forever. The group is always closed, even after a failed init.
  ncclResult_t first_error = ncclSuccess;
  int failed_rank = base;
  check_nccl(ncclGroupStart(), base, nullptr, "ncclGroupStart");
  for (int k = 0; k < n_local && first_error == ncclSuccess; ++k) {
    if (cudaSetDevice(cuda_devices[static_cast<size_t>(k)]) != cudaSuccess) {
      first_error = ncclUnhandledCudaError;
      failed_rank = base + k;
      break;
    }
    first_error = ncclCommInitRank(&raw[static_cast<size_t>(k)], nranks, id, base + k);
    failed_rank = base + k;
  }
  const ncclResult_t end = ncclGroupEnd();
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  out.reserve(raw.size());
  for (int k = 0; k < n_local; ++k)
    if (raw[static_cast<size_t>(k)])
      out.emplace_back(new NcclCommunicator(raw[static_cast<size_t>(k)],
                                            cuda_devices[static_cast<size_t>(k)], base + k, nranks));
  check_nccl(first_error, failed_rank, nullptr, cat("ncclCommInitRank of ", nranks, " ranks"));
  check_nccl(end, base, nullptr, cat("ncclCommInitRank of ", nranks, " ranks (group end)"));
  OT_CHECK(static_cast<int>(out.size()) == n_local, "NCCL rank ", base,
           ": ncclCommInitRank returned no communicator");
  for (auto& c : out) {
    DeviceGuard guard(c->device_, c->rank_);
    c->check(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags");
  }
  return out;
}

bool NcclCommunicator::is_device_memory(const void* p, std::string_view what) const {
  cudaPointerAttributes attr{};
  check(cudaPointerGetAttributes(&attr, p), cat(what, ": cudaPointerGetAttributes"));
  if (attr.type == cudaMemoryTypeManaged) return true;
  if (attr.type != cudaMemoryTypeDevice) return false;  // pageable or pinned host memory
  OT_CHECK(attr.device == device_, "NCCL rank ", rank_, ": ", what,
           ": buffer is memory of CUDA device ", attr.device, ", this rank drives device ",
           device_);
  return true;
}

std::byte* NcclCommunicator::staging(size_t bytes) {
  if (bytes > staging_bytes_) {
    // Stream-ordered on the comm stream: cudaFree/cudaMalloc would synchronize the device,
    // which can deadlock against a collective still waiting for its peers.
    if (staging_) check(cudaFreeAsync(staging_, stream_), "cudaFreeAsync (staging)");
    staging_ = nullptr;
    staging_bytes_ = 0;
    void* p = nullptr;
    check(cudaMallocAsync(&p, bytes, stream_), cat("cudaMallocAsync of ", bytes, " staging bytes"));
    staging_ = static_cast<std::byte*>(p);
    staging_bytes_ = bytes;
  }
  return staging_;
}

void NcclCommunicator::sync(std::string_view what) const {
  check(cudaStreamSynchronize(stream_), cat(what, " (cudaStreamSynchronize)"));
}

void NcclCommunicator::all_reduce(void* buf, int64_t count, DataType dtype, ReduceOp op) {
  check_comm_args(buf, count, dtype, false, "all_reduce");
  const ncclDataType_t type = nccl_sum_type(dtype, "all_reduce");
  if (count == 0) return;
  DeviceGuard guard(device_, rank_);
  const size_t bytes = byte_size(count, dtype);
  const bool host = !is_device_memory(buf, "all_reduce");
  void* p = host ? staging(bytes) : buf;
  if (host) check(cudaMemcpyAsync(p, buf, bytes, cudaMemcpyHostToDevice, stream_), "all_reduce (copy in)");
  check(ncclAllReduce(p, p, static_cast<size_t>(count), type, ncclSum, comm_, stream_),
        "ncclAllReduce");
  if (host) check(cudaMemcpyAsync(buf, p, bytes, cudaMemcpyDeviceToHost, stream_), "all_reduce (copy out)");
  sync("all_reduce");
}

CommHandle NcclCommunicator::all_reduce_async(void* buf, int64_t count, DataType dtype,
                                              ReduceOp op) {
  check_comm_args(buf, count, dtype, false, "all_reduce_async");
  const ncclDataType_t type = nccl_sum_type(dtype, "all_reduce_async");
  if (count == 0) return CommHandle();
  DeviceGuard guard(device_, rank_);
  if (!is_device_memory(buf, "all_reduce_async")) {
    // Host memory is staged synchronously: the handle is already done.
    all_reduce(buf, count, dtype, op);
    return CommHandle();
  }
  check(ncclAllReduce(buf, buf, static_cast<size_t>(count), type, ncclSum, comm_, stream_),
        "ncclAllReduce (async)");
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  auto work = std::make_shared<NcclWork>(event, device_, rank_);
  check(cudaEventRecord(event, stream_), "cudaEventRecord");
  return CommHandle(std::move(work));
}

void NcclCommunicator::broadcast(void* buf, int64_t count, DataType dtype, int root) {
  check_comm_args(buf, count, dtype, false, "broadcast");
  OT_CHECK(root >= 0 && root < size_, "NCCL rank ", rank_, ": broadcast: root ", root,
           " is not a rank (size ", size_, ")");
  if (count == 0) return;
  DeviceGuard guard(device_, rank_);
  const size_t bytes = byte_size(count, dtype);
  const bool host = !is_device_memory(buf, "broadcast");
  void* p = host ? staging(bytes) : buf;
  if (host && rank_ == root)
    check(cudaMemcpyAsync(p, buf, bytes, cudaMemcpyHostToDevice, stream_), "broadcast (copy in)");
  // Moved as bytes: a broadcast never interprets the elements.
  check(ncclBroadcast(p, p, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
  if (host) check(cudaMemcpyAsync(buf, p, bytes, cudaMemcpyDeviceToHost, stream_), "broadcast (copy out)");
  sync("broadcast");
}

void NcclCommunicator::all_gather(const void* send, void* recv, int64_t count, DataType dtype) {
  check_comm_args(send, count, dtype, false, "all_gather (send)");
  OT_CHECK(count <= INT64_MAX / size_, "NCCL rank ", rank_, ": all_gather: count ", count,
           " x ", size_, " ranks overflows");
  check_comm_args(recv, count * size_, dtype, false, "all_gather (recv)");
  if (count == 0) return;
  DeviceGuard guard(device_, rank_);
  const size_t bytes = byte_size(count, dtype);
  const size_t total = bytes * static_cast<size_t>(size_);
  const bool host_send = !is_device_memory(send, "all_gather (send)");
  const bool host_recv = !is_device_memory(recv, "all_gather (recv)");
  std::byte* stage = (host_send || host_recv) ? staging(align_up(bytes) + total) : nullptr;
  const void* s = host_send ? stage : send;
  void* r = host_recv ? stage + align_up(bytes) : recv;
  if (host_send)
    check(cudaMemcpyAsync(stage, send, bytes, cudaMemcpyHostToDevice, stream_), "all_gather (copy in)");
  check(ncclAllGather(s, r, bytes, ncclUint8, comm_, stream_), "ncclAllGather");
  if (host_recv)
    check(cudaMemcpyAsync(recv, r, total, cudaMemcpyDeviceToHost, stream_), "all_gather (copy out)");
  sync("all_gather");
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, int64_t count_per_rank,
                                      DataType dtype, ReduceOp op) {
  OT_CHECK(count_per_rank <= INT64_MAX / size_, "NCCL rank ", rank_, ": reduce_scatter: count ",
           count_per_rank, " x ", size_, " ranks overflows");
  check_comm_args(send, count_per_rank * size_, dtype, false, "reduce_scatter (send)");
  check_comm_args(recv, count_per_rank, dtype, false, "reduce_scatter (recv)");
  const ncclDataType_t type = nccl_sum_type(dtype, "reduce_scatter");
  if (count_per_rank == 0) return;
  DeviceGuard guard(device_, rank_);
  const size_t bytes = byte_size(count_per_rank, dtype);
  const size_t total = bytes * static_cast<size_t>(size_);
  const bool host_send = !is_device_memory(send, "reduce_scatter (send)");
  const bool host_recv = !is_device_memory(recv, "reduce_scatter (recv)");
  std::byte* stage = (host_send || host_recv) ? staging(align_up(total) + bytes) : nullptr;
  const void* s = host_send ? stage : send;
  void* r = host_recv ? stage + align_up(total) : recv;
  if (host_send)
    check(cudaMemcpyAsync(stage, send, total, cudaMemcpyHostToDevice, stream_),
          "reduce_scatter (copy in)");
  check(ncclReduceScatter(s, r, static_cast<size_t>(count_per_rank), type, ncclSum, comm_, stream_),
        "ncclReduceScatter");
  if (host_recv)
    check(cudaMemcpyAsync(recv, r, bytes, cudaMemcpyDeviceToHost, stream_),
          "reduce_scatter (copy out)");
  sync("reduce_scatter");
}

void NcclCommunicator::barrier() {
  // A one-element all_reduce every rank must join, finished on the host.
  DeviceGuard guard(device_, rank_);
  void* p = staging(sizeof(int32_t));
  check(cudaMemsetAsync(p, 0, sizeof(int32_t), stream_), "barrier (cudaMemsetAsync)");
  check(ncclAllReduce(p, p, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce (barrier)");
  sync("barrier");
}

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(
    const std::vector<int>& cuda_devices, ProcessWorld* world) {
  std::vector<std::unique_ptr<NcclCommunicator>> made =
      world ? NcclCommunicator::create_world(*world, cuda_devices)
            : NcclCommunicator::create_local(cuda_devices);
  std::vector<std::unique_ptr<Communicator>> out;
  out.reserve(made.size());
  for (auto& c : made) out.push_back(std::move(c));
  return out;
}

}  // namespace onnxtrain::runtime
