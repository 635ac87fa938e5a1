// Execution of an ONNX graph on the session's device (the CPU or a GPU): plans per input-shape
// signature (cached), constant folding at plan time, a liveness-based memory plan, resident
// device inputs, in-place state updates, collectives through a communicator, and a profiler.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/onnx_io.h"
#include "graph/tensor.h"
#include "ops/op_api.h"
#include "runtime/device/device.h"

namespace onnxtrain::runtime {

class Communicator;  // runtime/comm/communicator.h

struct SessionOptions {
  int threads = 0;                  // intra-op threads; 0 = all cores
  std::string profile_path;         // Chrome trace written by write_profile() / at destruction
  int64_t max_tensor_bytes = int64_t{4} << 30;  // cap for any planned or folded value
  // The replica's communicator, what collective kernels (AllReduce, SyncBatchNormalization) see
  // as KernelContext::collectives(); not owned. nullptr outside data-parallel training.
  Communicator* communicator = nullptr;
  // Graph outputs written into the buffer of a graph input, output name -> input name (a
  // training step's `S.updated` -> `S`): the state is updated in place. The caller's tensor for
  // such an input must own its buffer alone (Tensor::mutable_data() makes sure) and holds the
  // new value after run(), which returns an empty tensor for the output. The producing kernel
  // writes the buffer directly when its schema allows (OpSchema::inplace) and no later node
  // reads the input; otherwise the value is copied there at the end of the run.
  std::map<std::string, std::string> output_aliases;
  // Where tensors live and kernels run (runtime/device/device.h); nullptr = the CPU.
  std::shared_ptr<Device> device;
  // DataParallelSession: replica k runs on replica_devices[k] (one per local replica); empty =
  // `device` for every replica.
  std::vector<std::shared_ptr<Device>> replica_devices;
};

struct PlanStats {
  int64_t arena_bytes = 0;      // peak bytes of planned intermediates (buffers reused by liveness)
  int64_t unshared_bytes = 0;   // what they would need without reuse
  int64_t workspace_bytes = 0;  // the host kernels' shared scratch (KernelContext::scratch)
  int64_t persistent_scratch_bytes = 0;  // scratch kept per node (device kernels, AllReduce)
  int folded_nodes = 0;         // nodes computed once at plan time
  int kernel_nodes = 0;         // nodes run per step
  int dynamic_nodes = 0;        // nodes whose output shapes are only known at run time
  int aliased_in_place = 0;     // output_aliases the producing kernel writes directly
  int aliased_copied = 0;       // output_aliases copied into the input at the end of a run
  int packed_blocks = 0;        // steps whose inputs are placed as one block (packed_inputs)
  int view_nodes = 0;           // shape relabelings placed over their input (OpSchema::view)
  int device_nodes = 0;         // nodes run by the device's own kernels (0 on the CPU)
  int staged_nodes = 0;         // nodes run by CPU kernels through host copies on a device
};

class Plan;
class StepContext;
namespace plan_util {
struct GrowingBuffer;
}

class InferenceSession {
 public:
  // Throws Error listing every op without a CPU kernel before anything runs (sequence ops
  // included: run passes::lower_sequences on the model first).
  explicit InferenceSession(std::unique_ptr<graph::Model> model, SessionOptions opts = {});
  ~InferenceSession();
  static std::unique_ptr<InferenceSession> load(const std::string& path, SessionOptions opts = {});

  // Runs the graph. `inputs` by graph input name (initializer-backed inputs may be omitted);
  // returns the graph outputs in order.
  std::vector<graph::Tensor> run(const std::map<std::string, graph::Tensor>& inputs);
  // Builds (or finds) the plan run() would use for these inputs' dtypes and dims -- shapes
  // inferred, kernels prepared, memory planned and touched -- without running it, so the first
  // run() costs what later ones do. Only the inputs' dtypes and dims are read.
  void prepare(const std::map<std::string, graph::Tensor>& inputs);

  const graph::Model& model() const { return *model_; }
  Device& device() const { return *opts_.device; }
  // Device inputs: `name` (a graph input) is held in the device's memory and bound to every run
  // without being passed to run() (training state stays on the GPU; output_aliases update it in
  // place). set_resident uploads a value (dtype and dims checked against the graph input and a
  // previous value); get_resident downloads the current one. On the CPU device they hold a copy.
  void set_resident(const std::string& name, const graph::Tensor& value);
  graph::Tensor get_resident(const std::string& name) const;
  bool has_resident(const std::string& name) const { return resident_.count(name) != 0; }
  // KernelContext::random_seed() of the following runs (0: none).
  void set_random_seed(uint64_t seed) { random_seed_ = seed; }
  const PlanStats& last_plan_stats() const;
  size_t cached_plans() const { return plans_.size(); }
  // Bytes of the host arena and workspace the session's top-level plans share (the largest
  // plan's, not the sum over plans); 0 on a device.
  int64_t shared_host_bytes() const;
  // Writes the Chrome trace of every run so far.
  void write_profile(const std::string& path) const;

 private:
  std::unique_ptr<graph::Model> model_;
  SessionOptions opts_;
  std::map<std::string, std::unique_ptr<Plan>> plans_;  // by input-shape signature
  std::map<std::string, DeviceTensor> resident_;
  Plan* last_plan_ = nullptr;
  // The host arena and kernel workspace every top-level CPU plan of this session shares: plans
  // never run at once, so a second input shape (a partial last batch) costs no second arena.
  std::shared_ptr<plan_util::GrowingBuffer> host_arena_, host_workspace_;
  // The plan for these inputs (built when new); fills what its run() takes.
  Plan& plan_for(const std::map<std::string, graph::Tensor>& inputs,
                 std::map<std::string, const graph::Tensor*>& bound,
                 std::map<std::string, const DeviceTensor*>& resident);
  struct TraceEvent {
    std::string name, op;
    int64_t start_us, dur_us;
  };
  std::vector<TraceEvent> trace_;
  int64_t trace_origin_us_ = 0;
  uint64_t random_seed_ = 0;
  friend class Plan;
  friend class StepContext;
};

// Throws "<path>: unsupported ops (no CPU kernel): ..." naming every op without a kernel, with a
// hint at --custom-op-lib when one is in a custom domain. Tools call it before any other work.
// Sequence ops that passes::lower_sequences rewrites into tensor ops pass (the tools run that
// pass before they build a session); each one it cannot lower is named with the reason.
void require_supported_ops(const graph::Model& m, const std::string& path);

// Ops of the model (main graph and subgraphs) with no registered CPU kernel at the model's
// opset, as "domain.Op" / "Op", sorted and unique.
std::vector<std::string> unsupported_ops(const graph::Model& m);

}  // namespace onnxtrain::runtime
