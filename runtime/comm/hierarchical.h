// Data parallelism over several processes with R replica threads each: replica k of process p
// is global rank p*R + k of P*R. Collectives run in three stages — among the process's replica
// threads (InProcessCommunicator), across the processes (ProcessWorld, called by local rank 0
// only), back to the replica threads — so every replica of every process ends with identical
// bytes.
#pragma once

#include "runtime/comm/communicator.h"
#include "runtime/comm/process_world.h"

namespace onnxtrain::runtime {

class HierarchicalCommunicator final : public Communicator {
 public:
  // `local`: this replica's communicator among the process's replicas (rank k of R);
  // `world`: the processes. Neither is owned; both must outlive this communicator.
  HierarchicalCommunicator(Communicator& local, ProcessWorld& world);

  int rank() const override;
  int size() const override;
  // Sum within the process (rank order), across processes (process order), broadcast back.
  void all_reduce(void* buf, int64_t count, DataType dtype, ReduceOp op = ReduceOp::kSum) override;
  // The replica threads' sum now; the processes' sum is started (ProcessWorld::
  // all_reduce_start) and finished, then handed to the replica threads, by the handle's wait():
  // the transfer between processes overlaps the work in between. Every replica thread waits
  // its handles in issue order.
  CommHandle all_reduce_async(void* buf, int64_t count, DataType dtype,
                              ReduceOp op = ReduceOp::kSum) override;
  void broadcast(void* buf, int64_t count, DataType dtype, int root) override;
  void all_gather(const void* send, void* recv, int64_t count, DataType dtype) override;
  void reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DataType dtype,
                      ReduceOp op = ReduceOp::kSum) override;
  void barrier() override;

 private:
  Communicator& local_;
  ProcessWorld& world_;
};

}  // namespace onnxtrain::runtime
