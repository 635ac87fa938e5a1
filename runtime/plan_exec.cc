// Plan execution: one run binds the inputs, runs every step's kernel in order, finishes the
// deferred completions of asynchronous kernels (AllReduce) before their first reader, and
// collects the outputs.
#include <exception>
#include <functional>
#include <new>
#include <utility>

#include "graph/error.h"
#include "ops/infer.h"
#include "runtime/plan.h"
#include "runtime/plan_util.h"
#include "runtime/step_context.h"

namespace onnxtrain::runtime {

using graph::DataType;
using graph::Tensor;
using graph::ValueType;
using plan_util::now_us;

void Plan::execute(Step& step, int index, bool at_plan_time) {
  int threads = session_.opts_.threads;
  if (step.dynamic && !at_plan_time) reprepare_dynamic(step);
  if (at_plan_time) {
    StepContext prep(*this, step, threads);
    step.kernel->prepare(prep);
  }
  // Outputs of an asynchronous kernel this step reads: finish them first.
  for (int s : step.in)
    if (s >= 0 && slots_[s].pending >= 0) complete(slots_[s].pending);
  const bool staged = device_mode_ && step.on_host && !at_plan_time;
  std::vector<std::pair<int, ops::TensorView>> swapped;
  if (staged) stage_inputs(step, swapped);
  StepContext ctx(*this, step, threads);
  bool profile = !session_.opts_.profile_path.empty() && !at_plan_time;
  int64_t t0 = profile ? now_us() : 0;
  deferred_ = nullptr;
  try {
    step.kernel->run(ctx);
  } catch (...) {
    for (auto& [s, v] : swapped) slots_[s].bind.view = v;
    throw;
  }
  for (auto& [s, v] : swapped) slots_[s].bind.view = v;
  if (staged) {
    // A CPU kernel's deferred work (the host AllReduce) writes host buffers: finish it now.
    if (deferred_) {
      std::function<void()> finish = std::move(deferred_);
      deferred_ = nullptr;
      finish();
    }
    upload_outputs(step);
  }
  if (profile) {
    int64_t t1 = now_us();
    if (session_.trace_origin_us_ == 0) session_.trace_origin_us_ = t0;
    session_.trace_.push_back({step.node->name.empty() ? step.node->op_type : step.node->name,
                               step.node->op_type, t0 - session_.trace_origin_us_, t1 - t0});
  }
  if (deferred_) {
    Pending p{
        std::move(deferred_), {}, step.node->name.empty() ? step.node->op_type : step.node->name};
    deferred_ = nullptr;
    const int id = static_cast<int>(pending_.size());
    for (int s : step.out)
      if (s >= 0) {
        slots_[s].pending = id;
        p.slots.push_back(s);
      }
    pending_.push_back(std::move(p));
  }
  // Outputs the kernel never wrote through output(): fail loudly rather than read garbage.
  for (size_t i = 0; i < step.out.size(); ++i) {
    int s = step.out[i];
    if (s < 0) continue;
    const Binding& b = slots_[s].bind;
    OT_CHECK(b.view.data || b.view.strings || b.view.numel() == 0 || slots_[s].arena_offset >= 0,
             step.node->describe(), ": kernel did not produce output ", i);
  }
  if (index >= 0)
    for (int s : release_after_[index]) slots_[s].bind = Binding{};
}

void Plan::reprepare_dynamic(Step& step) {
  // Re-infer with the actual dims so output(i) knows its shape where inference can tell.
  ops::InferenceContext ictx{
      *step.node, model_.opset_version(step.node->domain).value_or(1), {}, {}, {}, {}};
  ictx.default_opset = default_opset_;
  std::vector<ValueType> types;
  types.reserve(step.in.size());
  for (int s : step.in) {
    if (s < 0) {
      ictx.input_types.push_back(nullptr);
      ictx.input_values.push_back(nullptr);
      continue;
    }
    const ops::TensorView& v = slots_[s].bind.view;
    types.push_back(ValueType::tensor(v.dtype, graph::make_shape(v.dims)));
    ictx.input_types.push_back(&types.back());
    ictx.input_values.push_back(slots_[s].is_constant ? &slots_[s].constant : nullptr);
  }
  ictx.output_types.resize(step.out.size());
  ictx.output_values.resize(step.out.size());
  ops::run_inference(*step.schema, ictx);
  for (size_t i = 0; i < step.out.size(); ++i)
    if (step.out[i] >= 0 && i < ictx.output_types.size() &&
        ictx.output_types[i].dtype != DataType::kUndefined)
      slots_[step.out[i]].type = ictx.output_types[i];
  StepContext prep(*this, step, session_.opts_.threads);
  step.kernel->prepare(prep);
}

void Plan::complete(int id) {
  Pending& p = pending_[static_cast<size_t>(id)];
  if (!p.finish) return;
  std::function<void()> finish = std::move(p.finish);
  p.finish = nullptr;
  for (int s : p.slots) slots_[s].pending = -1;
  // Earlier deferred work first: completions run in issue order.
  for (int k = 0; k < id; ++k)
    if (pending_[static_cast<size_t>(k)].finish) complete(k);
  const bool profile = !session_.opts_.profile_path.empty();
  const int64_t t0 = profile ? now_us() : 0;
  finish();
  if (profile) {
    if (session_.trace_origin_us_ == 0) session_.trace_origin_us_ = t0;
    session_.trace_.push_back(
        {p.name + " (wait)", "Wait", t0 - session_.trace_origin_us_, now_us() - t0});
  }
}

void Plan::complete_all() {
  for (size_t k = 0; k < pending_.size(); ++k) complete(static_cast<int>(k));
  pending_.clear();
}

std::vector<Tensor> Plan::run(const std::map<std::string, const Tensor*>& inputs,
                              const ResidentMap& resident) {
  if (device_mode_) device_->activate();
  for (const auto& [s, ps] : captures_) slots_[s].bind.view = parent_->slots_[ps].bind.view;
  bind_inputs(inputs, resident);
  pending_.clear();
  try {
    for (size_t i = 0; i < steps_.size(); ++i) {
      try {
        execute(steps_[i], static_cast<int>(i), false);
      } catch (const std::bad_alloc&) {
        fail(steps_[i].node->describe(), ": out of memory");
      }
    }
    complete_all();
  } catch (...) {
    // Deferred work still uses this plan's buffers: let it finish (its own errors are
    // secondary to the one being reported).
    for (Pending& p : pending_) {
      if (!p.finish) continue;
      try {
        p.finish();
      } catch (...) {
      }
      for (int s : p.slots) slots_[s].pending = -1;
    }
    pending_.clear();
    throw;
  }
  std::vector<Tensor> out = collect_outputs();
  // Surfaces a device kernel's asynchronous failure in this run, and finishes the in-place state
  // updates before the caller reads the state.
  if (device_mode_) device_->synchronize();
  return out;
}

}  // namespace onnxtrain::runtime
