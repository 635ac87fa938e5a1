// StepContext: the runtime's ops::KernelContext, what one step's kernel sees of its plan —
// input and output views (host copies for a staged step), scratch, the stream, intra-op
// threads, subgraphs, the session's collectives and deferred completion.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "graph/error.h"
#include "ops/op_api.h"
#include "runtime/comm/communicator.h"
#include "runtime/plan.h"

namespace onnxtrain::runtime {

class StepContext final : public ops::KernelContext {
 public:
  StepContext(Plan& plan, Step& step, int threads)
      : plan_(plan),
        step_(step),
        threads_(threads),
        staged_(plan.device_mode_ && step.on_host),
        native_(plan.device_mode_ && !step.on_host) {}

  const graph::Node& node() const override { return *step_.node; }
  int64_t opset() const override { return plan_.default_opset_; }
  ops::Collectives* collectives() const override { return plan_.session_.opts_.communicator; }
  void defer_completion(std::function<void()> finish) override {
    OT_CHECK(!plan_.deferred_, node().describe(), ": a kernel may defer one completion per run");
    plan_.deferred_ = std::move(finish);
  }
  int num_inputs() const override { return static_cast<int>(step_.in.size()); }
  const ops::TensorView* input(int i) const override {
    if (i < 0 || i >= num_inputs() || step_.in[i] < 0) return nullptr;
    // A staged step reads host copies (Plan::stage_inputs); a device kernel device memory.
    if (staged_) return &plan_.slots_[step_.in[i]].host_view;
    return &plan_.slots_[step_.in[i]].bind.view;
  }
  const ops::TensorView* host_constant(int i) const override {
    if (!input_is_constant(i)) return nullptr;
    return plan_.device_mode_ ? &plan_.slots_[step_.in[i]].host_view : input(i);
  }
  bool input_is_constant(int i) const override {
    return i >= 0 && i < num_inputs() && step_.in[i] >= 0 && plan_.slots_[step_.in[i]].is_constant;
  }
  int num_outputs() const override { return static_cast<int>(step_.out.size()); }
  bool has_output(int i) const override { return i >= 0 && i < num_outputs() && step_.out[i] >= 0; }
  ops::TensorView& output(int i, std::span<const int64_t> dims) override;
  ops::TensorView& output(int i) override;
  // Grows the step's buffer; a second call in the same run() may move it.
  void* scratch(size_t bytes) override;
  void* persistent_scratch(size_t bytes) override;
  ops::DeviceKind device() const override {
    return native_ ? plan_.device_->kind() : ops::DeviceKind::kCpu;
  }
  void* stream() const override { return native_ ? plan_.device_->stream() : nullptr; }
  int num_threads() const override { return threads_; }
  uint64_t random_seed() const override { return plan_.session_.random_seed_; }
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& fn) const override;
  ops::Subgraph& subgraph(const std::string& attr) override;

 private:
  // A host buffer for output i: off-plan values on the CPU, every output of a staged step (the
  // plan copies it to the device after the kernel ran).
  ops::TensorView& host_output(int i, const Slot& slot, Binding& b, std::vector<int64_t> d);
  // Bytes of output i with dims d; throws above SessionOptions::max_tensor_bytes.
  size_t checked_bytes(int i, const Slot& slot, const std::vector<int64_t>& d) const;

  Plan& plan_;
  Step& step_;
  int threads_;
  bool staged_;  // device mode, CPU kernel: host copies in and out
  bool native_;  // device mode, device kernel: device memory
};

}  // namespace onnxtrain::runtime
