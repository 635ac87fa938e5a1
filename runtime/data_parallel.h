// Synchronous data parallelism on one machine: R replicas of a training graph, each run by its
// own executor on its own thread, gradients summed by AllReduce nodes through an in-process
// communicator, so every replica applies the same update (MirroredStrategy on CPUs).
//
// The graph is what passes::build_training_graph produces: with replicas == 1 the plain
// training graph; with R > 1 the replicated one (ShardBatch nodes split the global batch,
// nodes and state carry `/r<k>` suffixes, AllReduce nodes ahead of the updates). Replica k's
// executor runs its partition: the nodes whose device is replica k's, plus its share of the
// ShardBatch and AllReduce nodes.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/tensor.h"
#include "runtime/session.h"
#include "runtime/training_session.h"

namespace onnxtrain::runtime {

class DataParallelSession {
 public:
  // `opts.threads` is the total intra-op budget, split evenly across the replicas (at least 1
  // each). Throws when the graph's replica count (its ShardBatch/AllReduce `replicas`) differs.
  DataParallelSession(std::unique_ptr<graph::Model> training_graph, int replicas,
                      SessionOptions opts = {});
  ~DataParallelSession();

  int replicas() const { return replicas_; }
  // One synchronous step on the GLOBAL batch (model inputs and labels/targets with the global
  // batch dim; replica k gets its share of the rows). loss and correct are summed over the
  // replicas: with loss_scale = 1/global batch, `loss` is the global-batch mean.
  // `seed` (non-zero): the step's random seed; replica k runs with a seed derived from it and k
  // (different Dropout masks per replica, the same ones again after a resume).
  StepResult step(const std::map<std::string, graph::Tensor>& global_batch, float lr,
                  float loss_scale, uint64_t seed = 0);

  // Graph state under its single-replica names (replica 0's copy: "S" for "S/r0").
  std::map<std::string, graph::Tensor> state() const;
  // Sets state (single-replica names) on every replica; unknown names throw.
  void set_state(const std::map<std::string, graph::Tensor>& state);
  // `original` with the trained weights and BN running statistics.
  std::unique_ptr<graph::Model> trained_model(const graph::Model& original) const;
  // True when every replica's state is bit-identical to replica 0's.
  bool replicas_identical() const;
  // A well-mixed non-zero seed from `a` and `b` (splitmix64), for per-step and per-replica seeds.
  static uint64_t mix_seed(uint64_t a, uint64_t b);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int replicas_ = 1;
};

}  // namespace onnxtrain::runtime
