// HierarchicalCommunicator (hierarchical.h): replica threads within a process, then processes.
#include "runtime/comm/hierarchical.h"

#include <cstring>
#include <memory>
#include <vector>

#include "graph/error.h"

namespace onnxtrain::runtime {

HierarchicalCommunicator::HierarchicalCommunicator(Communicator& local, ProcessWorld& world)
    : local_(local), world_(world) {}

int HierarchicalCommunicator::rank() const { return world_.rank() * local_.size() + local_.rank(); }
int HierarchicalCommunicator::size() const { return world_.size() * local_.size(); }

void HierarchicalCommunicator::all_reduce(void* buf, int64_t count, DataType dtype, ReduceOp op) {
  check_comm_args(buf, count, dtype, true, "all_reduce");
  local_.all_reduce(buf, count, dtype, op);
  // Every replica thread of this process holds the same local sum; one of them takes it to
  // the other processes and hands the global sum back.
  if (local_.rank() == 0) world_.all_reduce(buf, count, dtype, "all_reduce (gradients)");
  local_.broadcast(buf, count, dtype, 0);
}

namespace {

// The process stage of an asynchronous all_reduce: local rank 0 started the world's sum of the
// process's local sum; wait() finishes it there and hands it to the replica threads (a local
// broadcast: every replica thread waits its handles in the same order).
class HierarchicalWork final : public CommWork {
 public:
  HierarchicalWork(Communicator& local, ProcessWorld& world, uint64_t ticket, void* buf,
                   int64_t count, DataType dtype)
      : local_(local), world_(world), ticket_(ticket), buf_(buf), count_(count), dtype_(dtype) {}
  void wait() override {
    if (done_) return;
    if (local_.rank() == 0) world_.all_reduce_wait(ticket_);
    local_.broadcast(buf_, count_, dtype_, 0);
    done_ = true;
  }
  bool done() const override { return done_; }

 private:
  Communicator& local_;
  ProcessWorld& world_;
  uint64_t ticket_;
  void* buf_;
  int64_t count_;
  DataType dtype_;
  bool done_ = false;
};

}  // namespace

CommHandle HierarchicalCommunicator::all_reduce_async(void* buf, int64_t count, DataType dtype,
                                                      ReduceOp op) {
  check_comm_args(buf, count, dtype, true, "all_reduce");
  local_.all_reduce(buf, count, dtype, op);
  const uint64_t ticket =
      local_.rank() == 0 ? world_.all_reduce_start(buf, count, dtype, "all_reduce (gradients)") : 0;
  return CommHandle(std::make_shared<HierarchicalWork>(local_, world_, ticket, buf, count, dtype));
}

void HierarchicalCommunicator::broadcast(void* buf, int64_t count, DataType dtype, int root) {
  check_comm_args(buf, count, dtype, false, "broadcast");
  const int r = local_.size();
  OT_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " is not a rank of ", size());
  const int root_process = root / r;
  // Within the root's process the value goes to local rank 0 first; the other processes skip
  // that stage (all their replica threads agree on it, so none waits for it).
  if (world_.rank() == root_process && root % r != 0) local_.broadcast(buf, count, dtype, root % r);
  if (local_.rank() == 0) world_.broadcast(buf, count, dtype, root_process, "broadcast");
  local_.broadcast(buf, count, dtype, 0);
}

void HierarchicalCommunicator::all_gather(const void* send, void* recv, int64_t count,
                                          DataType dtype) {
  check_comm_args(send, count, dtype, false, "all_gather");
  check_comm_args(recv, count * size(), dtype, false, "all_gather");
  const int64_t es = comm_element_size(dtype, "all_gather");
  std::vector<std::byte> mine(static_cast<size_t>(count * local_.size() * es));
  local_.all_gather(send, mine.data(), count, dtype);
  // Global rank p*R + k lands at (p*R + k) * count: the processes' blocks in process order.
  if (local_.rank() == 0) world_.all_gather(mine.data(), recv, count * local_.size(), dtype, "all_gather");
  local_.broadcast(recv, count * size(), dtype, 0);
}

void HierarchicalCommunicator::reduce_scatter(const void* send, void* recv, int64_t count_per_rank,
                                              DataType dtype, ReduceOp op) {
  check_comm_args(send, count_per_rank * size(), dtype, true, "reduce_scatter");
  check_comm_args(recv, count_per_rank, dtype, true, "reduce_scatter");
  const int64_t es = comm_element_size(dtype, "reduce_scatter");
  const size_t chunk = static_cast<size_t>(count_per_rank * es);
  std::vector<std::byte> all(chunk * static_cast<size_t>(size()));
  if (!all.empty()) std::memcpy(all.data(), send, all.size());
  all_reduce(all.data(), count_per_rank * size(), dtype, op);
  if (chunk) std::memcpy(recv, all.data() + chunk * static_cast<size_t>(rank()), chunk);
}

void HierarchicalCommunicator::barrier() {
  local_.barrier();
  if (local_.rank() == 0) world_.barrier("barrier");
  local_.barrier();
}

}  // namespace onnxtrain::runtime
