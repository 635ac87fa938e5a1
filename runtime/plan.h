// A Plan: one input-shape signature of a model made executable. Built once (cached by the
// session; plan_build.cc): shape inference with concrete dims, constant folding, kernel
// preparation and a liveness-based memory plan (memory_plan.h); then run() per call
// (plan_exec.cc), with host/device copies in plan_staging.cc and the kernels' view of a step in
// step_context.h.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "ops/op_api.h"
#include "runtime/device/device.h"
#include "runtime/session.h"
#include "runtime/plan_util.h"
#include "runtime/subgraph.h"

namespace onnxtrain::runtime {

// What kernels see of a value: its view (device memory in device mode) and what owns the buffer
// when the arena does not.
struct Binding {
  ops::TensorView view;
  graph::Tensor owned;                      // dynamic buffers and string tensors (host)
  std::shared_ptr<std::byte> device_owned;  // dynamic buffers and constants on a device
};

// One value the plan knows about: what planning decided, then its run-time state.
struct Slot {
  const graph::Value* value = nullptr;
  graph::ValueType type;     // planned type; dims concrete when is_static
  bool is_constant = false;  // initializer or folded at plan time
  graph::Tensor constant;
  bool is_input = false;   // bound to a caller's tensor each run
  bool is_static = false;  // dims known at plan time (arena candidate)
  int64_t arena_offset = -1;
  size_t bytes = 0;
  int def_step = -1;  // step producing it (-1: before the first step)
  int last_use = -1;  // last step reading it
  bool is_output = false;
  // SessionOptions::output_aliases: the input slot whose buffer this output is written into.
  int alias_input = -1;
  bool alias_direct = false;  // the kernel writes the input's buffer itself (no copy)
  int pending = -1;           // index into Plan::pending_ while a deferred write is open

  Binding bind;
  // Device mode only: the host side of a constant or of a staged step's input (what a staged
  // CPU kernel reads), the host copy made for a staged step, and the device buffer a caller's
  // input is copied into (kept for the next run).
  ops::TensorView host_view;
  graph::Tensor staged;
  std::shared_ptr<std::byte> input_buffer;
  size_t input_buffer_bytes = 0;
};

struct Step {
  const graph::Node* node = nullptr;
  const ops::OpSchema* schema = nullptr;
  std::unique_ptr<ops::Kernel> kernel;
  std::vector<int> in, out;  // slot ids, -1 for omitted
  bool dynamic = false;      // output dims only known at run time
  // Scratch this node keeps across runs (KernelContext::persistent_scratch, and every device
  // kernel's scratch); host kernels' ordinary scratch is the plan's shared workspace.
  std::shared_ptr<std::byte[]> scratch;
  size_t scratch_bytes = 0;
  // Runners of the node's graph attributes (If / Loop bodies), by attribute name, made on first
  // use.
  std::map<std::string, std::shared_ptr<ops::Subgraph>> subgraphs;
  // On a device without host memory: the node runs its CPU kernel, its inputs copied to the
  // host and its outputs back (no device kernel, a dynamic shape, strings, a graph attribute).
  bool on_host = false;
  std::shared_ptr<std::byte> device_scratch;  // a device kernel's scratch
  size_t device_scratch_bytes = 0;
};

// Inputs kept in a device's memory between runs (InferenceSession::set_resident), by name.
using ResidentMap = std::map<std::string, const DeviceTensor*>;

class Plan {
 public:
  Plan(InferenceSession& session, const std::map<std::string, const graph::Tensor*>& inputs,
       const ResidentMap& resident = {});
  // A control-flow body: `g` is a subgraph of a node of `parent`'s graph; every value it
  // captures from enclosing graphs is a constant or a run-time input bound from `parent`.
  Plan(InferenceSession& session, const graph::Graph& g, Plan* parent,
       const std::map<std::string, const graph::Tensor*>& inputs);
  std::vector<graph::Tensor> run(const std::map<std::string, const graph::Tensor*>& inputs,
                                 const ResidentMap& resident = {});
  const PlanStats& stats() const { return stats_; }

 private:
  friend class StepContext;
  friend class SubgraphRunner;
  void build(const std::map<std::string, const graph::Tensor*>& inputs,
             const ResidentMap& resident);
  int slot_of(const graph::Value* v);
  void infer_step(const graph::Node& n, std::vector<int>& in, ops::InferenceContext& ictx);
  void fold_or_schedule(const graph::Node& n);
  // The steps whose inputs plan_memory places back to back (OpSchema::packed_inputs): each
  // member's input and output share `offset` bytes into the block.
  struct PackedBlock {
    struct Member {
      int in = -1, out = -1;
      int64_t offset = 0;
    };
    std::vector<Member> members;
    size_t bytes = 0;
    int def = 0, last = 0;
  };
  // An intermediate the arena holds: known dims, produced by a step, not an input, output,
  // constant or state alias (what packed blocks and views may place).
  bool arena_intermediate(int s) const;
  std::vector<PackedBlock> packed_blocks(const std::vector<char>& taken) const;
  // OpSchema::view steps whose output plan_memory places over the input: per slot, the slot
  // whose buffer it shares (the first value of its chain of views), or -1.
  std::vector<int> view_roots() const;
  // Arena offsets of the static intermediates (memory_plan.h), the arena, and when dynamic
  // buffers are released.
  void plan_memory();
  void prepare_kernels();
  // The host kernels' shared scratch, at least `bytes` (KernelContext::scratch).
  std::byte* host_workspace(size_t bytes);
  // A top-level plan's host arena / workspace is the session's `shared` one (made on first use);
  // a control-flow body gets its own.
  std::shared_ptr<plan_util::GrowingBuffer> host_buffer(
      std::shared_ptr<plan_util::GrowingBuffer>& shared);
  // Binds a constant's buffer; on a device, `upload` also copies it to device memory.
  void bind_constant(int slot, bool upload = true);
  void execute(Step& step, int index, bool at_plan_time);
  // Re-infers a dynamic step with the actual input dims and prepares its kernel again.
  void reprepare_dynamic(Step& step);
  // Binds the caller's inputs and the resident device tensors for one run.
  void bind_inputs(const std::map<std::string, const graph::Tensor*>& inputs,
                   const ResidentMap& resident);
  // The graph outputs after a run (aliased ones written into their inputs).
  std::vector<graph::Tensor> collect_outputs();
  // Device mode: host copies of a staged step's inputs before it runs; its outputs to the device
  // after (and the body captures of a control-flow node, swapped in while it runs).
  void stage_inputs(Step& step, std::vector<std::pair<int, ops::TensorView>>& swapped);
  void upload_outputs(Step& step);
  // Device mode: the device kernel for a step when there is one, else the CPU kernel (on_host).
  void choose_kernel(Step& step);
  void fall_back_to_host(Step& step);
  // Resolves SessionOptions::output_aliases (top-level plan only).
  void plan_aliases();
  // Runs the deferred completion `id` (KernelContext::defer_completion) if still open.
  void complete(int id);
  void complete_all();

  InferenceSession& session_;
  const graph::Model& model_;
  const graph::Graph& graph_;
  Plan* parent_ = nullptr;
  std::vector<std::pair<int, int>> captures_;  // (this plan's slot, parent's slot), run-time bound
  int64_t default_opset_ = 1;
  std::vector<Slot> slots_;
  std::map<const graph::Value*, int> slot_index_;
  std::vector<Step> steps_;
  std::vector<std::vector<int>> release_after_;  // dynamic slots freed after each step
  // Host mode: the arena and the kernels' workspace; the session's shared ones for a top-level
  // plan, this plan's own for a control-flow body (which runs inside its parent's run).
  std::shared_ptr<plan_util::GrowingBuffer> arena_, workspace_;
  std::byte* host_arena() const { return arena_ ? arena_->data.get() : nullptr; }
  PlanStats stats_;
  // The session's device; device_mode_ when its memory is not host memory (a GPU): then
  // Slot::bind holds device pointers, Slot::host_view the host side.
  std::shared_ptr<Device> device_;
  bool device_mode_ = false;
  std::shared_ptr<std::byte> device_arena_;
  // Deferred completions of asynchronous kernels (AllReduce) in issue order, run before the
  // first reader of their outputs or at the end of run().
  struct Pending {
    std::function<void()> finish;
    std::vector<int> slots;
    std::string name;
  };
  std::vector<Pending> pending_;
  std::function<void()> deferred_;  // set by StepContext::defer_completion while a kernel runs
};

}  // namespace onnxtrain::runtime
