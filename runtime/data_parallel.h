// Synchronous data parallelism on one machine: R replicas of a training graph, each run by its
// own executor on its own thread, gradients summed by AllReduce nodes through an in-process
// communicator, so every replica applies the same update (MirroredStrategy on CPUs).
//
// The session takes one graph per local replica: replica k's partition of the replicated
// training graph (passes::partition_replicas: ShardBatch gives it its rows of the global batch,
// its AllReduce slots reduce with the other replicas), or for one replica in one process the
// plain training graph. The runtime never rewrites a graph: what each value means comes from
// the partitions' training signatures.
//
// Several processes (MPI): give the session the ProcessWorld. Each process runs R local replicas
// of a graph built for R replicas with TrainingOptions::collectives (so R == 1 has its
// ShardBatch and AllReduce nodes too); replica k's collectives go through a
// HierarchicalCommunicator as global rank p*R + k of P*R.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/tensor.h"
#include "runtime/comm/process_world.h"
#include "runtime/session.h"
#include "runtime/training_session.h"

namespace onnxtrain::runtime {

// The CPUs this process may run on (its affinity mask; empty if it cannot be read).
std::vector<int> allowed_cpus();

class DataParallelSession {
 public:
  // `partitions[k]` is replica k's graph (see above). `opts.threads` is the total intra-op
  // budget, split evenly across the replicas (at least 1 each). Throws when a partition's
  // signature does not say it is replica k's of a graph built for partitions.size() replicas.
  // `world` (not owned; nullptr or size 1 = this process alone): the other processes.
  DataParallelSession(std::vector<std::unique_ptr<graph::Model>> partitions,
                      SessionOptions opts = {}, ProcessWorld* world = nullptr);
  ~DataParallelSession();

  int replicas() const { return replicas_; }  // this process's
  ProcessWorld* world() const { return world_; }  // nullptr without other processes
  // One synchronous step on the GLOBAL batch (model inputs and labels/targets with the global
  // batch dim; replica k gets its share of the rows). loss and correct are summed over the
  // replicas: with loss_scale = 1/global batch, `loss` is the global-batch mean. With a world,
  // the batch is this process's rows and the sums cover every process's replicas.
  // `seed` (non-zero): the step's random seed; global replica g runs with a seed derived from it
  // and g (different Dropout masks per replica, the same ones again after a resume).
  // Builds every replica's plan for a global batch of these dtypes and dims, in parallel, before
  // the first step (TrainingSession::prepare).
  void prepare(const std::map<std::string, graph::Tensor>& global_batch);
  // `grad_scale`: TrainingSession::step's dynamic loss scale; `finite` is true when every
  // replica of every process found its gradients finite (they all reduce the same ones).
  StepResult step(const std::map<std::string, graph::Tensor>& global_batch, float lr,
                  float loss_scale, uint64_t seed = 0, float grad_scale = 1);

  // Graph state under its single-replica names (StateBinding::original): each value from the
  // first replica holding it (sharded optimizer state lives on one replica).
  std::map<std::string, graph::Tensor> state() const;
  // Sets state (single-replica names) on every replica; unknown names throw.
  void set_state(const std::map<std::string, graph::Tensor>& state);
  // `original` with the trained weights and BN running statistics.
  std::unique_ptr<graph::Model> trained_model(const graph::Model& original) const;
  // True when every replica's state is bit-identical to replica 0's.
  bool replicas_identical() const;
  // Replica k's session (0 <= k < replicas()): its plan, its state by replica name.
  TrainingSession& replica_session(int k);
  const TrainingSession& replica_session(int k) const;
  // A well-mixed non-zero seed from `a` and `b` (DataRng's SplitMix64), for per-step and
  // per-replica seeds.
  static uint64_t mix_seed(uint64_t a, uint64_t b);

 private:
  // Runs job(k) on replica k's thread for every k and waits for all; the first error throws
  // (and aborts the group, so replicas waiting in a collective return).
  void on_every_replica(const std::function<void(size_t k)>& job);
  void pin_replica_threads(int threads_per_replica);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int replicas_ = 1;
  ProcessWorld* world_ = nullptr;
};

}  // namespace onnxtrain::runtime
