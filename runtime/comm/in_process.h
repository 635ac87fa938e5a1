// In-process collectives: R replica threads of one process share an InProcessGroup and each
// talks through its rank's communicator. Deterministic (fixed rank-order sums, identical bytes
// on every rank), in place on the callers' buffers, and never a silent hang (abort + timeout).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/communicator.h"

namespace onnxtrain::runtime {

class InProcessGroup;

// One rank's side of a collective as published at the rendezvous (internal to the group).
// all_reduce works in place on `recv` (== send); broadcast on its `parts`.
struct InProcessCall {
  enum class Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kBarrier };
  Kind kind = Kind::kBarrier;
  int64_t count = 0;  // all_gather: per rank; reduce_scatter: per rank
  DataType dtype = DataType::kUndefined;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  uint64_t seq = 0;
  // A broadcast's buffers (one for broadcast(), several for broadcast_async); `count` is their
  // total.
  std::shared_ptr<const std::vector<ops::CollectiveBuffer>> parts;
};

// Rank k's view of an InProcessGroup. Every collective runs on this communicator's worker
// thread in issue order; synchronous calls enqueue and wait. Buffers are host memory. Use one
// communicator from one thread at a time (its replica thread).
class InProcessCommunicator final : public Communicator {
 public:
  // Finishes the queued collectives (bounded by the group's timeout), then stops the worker.
  ~InProcessCommunicator() override;
  InProcessCommunicator(const InProcessCommunicator&) = delete;
  InProcessCommunicator& operator=(const InProcessCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override;
  void all_reduce(void* buf, int64_t count, DataType dtype, ReduceOp op = ReduceOp::kSum) override;
  CommHandle all_reduce_async(void* buf, int64_t count, DataType dtype,
                              ReduceOp op = ReduceOp::kSum) override;
  void broadcast(void* buf, int64_t count, DataType dtype, int root) override;
  // One collective for all the buffers (non-root workers copy the root's bytes).
  CommHandle broadcast_async(const std::vector<ops::CollectiveBuffer>& bufs, DataType dtype,
                             int root) override;
  void all_gather(const void* send, void* recv, int64_t count, DataType dtype) override;
  void reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DataType dtype,
                      ReduceOp op = ReduceOp::kSum) override;
  void barrier() override;
  // The thread that runs this rank's collectives (DataParallelSession pins it next to its
  // replica's thread).
  std::thread::native_handle_type worker_handle() { return worker_.native_handle(); }

 private:
  friend class InProcessGroup;
  using Kind = InProcessCall::Kind;
  using Call = InProcessCall;
  // Completion state of one queued collective; the handle's CommWork. Errors cross threads
  // as messages (rethrown as Error by wait()), not as exception_ptr.
  class Work;
  struct Task {
    std::function<void()> run;
    std::shared_ptr<Work> work;
  };

  InProcessCommunicator(InProcessGroup& group, int rank);
  // Validates on the caller's thread (an invalid call aborts the group, so peers do not wait
  // for it) and queues the collective for the worker.
  std::shared_ptr<Work> submit(const Call& call);
  void execute(Call call);
  // This rank's share of the collective, given every rank's published call.
  void work(const Call& call, const std::vector<Call>& calls);
  void worker_loop();

  InProcessGroup& group_;
  const int rank_;
  uint64_t seq_ = 0;  // collectives executed so far; touched by the worker only
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Task>> queue_;
  bool stop_ = false;
  std::thread worker_;
};

class InProcessGroup {
 public:
  // `timeout`: how long a rank waits at a collective for the others before the collective
  // fails (and aborts the group) with an Error naming the ranks that did not arrive.
  explicit InProcessGroup(int size, std::chrono::milliseconds timeout = std::chrono::seconds(300));
  // Aborts what is still pending, then joins every communicator's worker.
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  InProcessCommunicator& communicator(int rank);

  // Call when a replica thread fails: every rank waiting in a collective, and every later
  // collective, throws an Error containing `reason`. The first reason wins; the group stays
  // aborted. A collective that every rank already joined still completes (its buffers are in
  // use by the other ranks).
  void abort(const std::string& reason);
  bool aborted() const;
  // Empty while not aborted.
  std::string abort_reason() const;

 private:
  friend class InProcessCommunicator;
  using Call = InProcessCall;

  // First rendezvous: publish `call`, wait for every rank, check that all calls match.
  // Throws on abort, mismatch or timeout. After it returns, calls_ stays fixed until depart.
  void arrive(int rank, const Call& call);
  // Second rendezvous: returns once every rank finished touching the published buffers.
  // Ignores abort: the ranks it waits for are running plain memory loops.
  void depart();
  void abort_locked(const std::string& reason);
  [[noreturn]] void throw_aborted_locked(int rank, const Call& call) const;

  const int size_;
  const std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<InProcessCommunicator>> comms_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> calls_;          // published call of each rank
  std::vector<char> arrived_flags_;  // who reached the current first rendezvous
  int arrived_ = 0;
  uint64_t arrive_generation_ = 0;
  int departed_ = 0;
  uint64_t depart_generation_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace onnxtrain::runtime
