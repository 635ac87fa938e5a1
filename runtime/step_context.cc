// The kernel context of a plan step (step_context.h).
#include "runtime/step_context.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>

#include "runtime/plan_util.h"
#include "runtime/subgraph.h"

namespace onnxtrain::runtime {

using graph::DataType;
using graph::Tensor;
using plan_util::concrete;
using plan_util::view_of;

ops::TensorView& StepContext::output(int i, std::span<const int64_t> dims) {
  OT_CHECK(has_output(i), node().describe(), ": output ", i, " is not requested");
  int s = step_.out[i];
  Slot& slot = plan_.slots_[s];
  Binding& b = slot.bind;
  std::vector<int64_t> d(dims.begin(), dims.end());
  if (staged_) return host_output(i, slot, b, std::move(d));
  if (slot.alias_direct) {
    // Written over the aliased input (training state updated in place).
    const ops::TensorView& target = plan_.slots_[slot.alias_input].bind.view;
    OT_CHECK(target.dims == d && target.dtype == slot.type.dtype, node().describe(), ": output ", i,
             " does not match the input it updates in place");
    b.owned = Tensor();
    b.view = target;
    return b.view;
  }
  if (slot.is_static && slot.arena_offset >= 0) {
    auto planned = concrete(slot.type);
    if (planned && *planned == d) {
      b.owned = Tensor();
      b.view.dtype = slot.type.dtype;
      b.view.dims = std::move(d);
      b.view.data = (native_ ? plan_.device_arena_.get() : plan_.host_arena()) + slot.arena_offset;
      b.view.strings = nullptr;
      return b.view;
    }
  }
  if (native_) {
    // Off-plan on the device: a fresh buffer from the device's caching allocator.
    const size_t bytes = checked_bytes(i, slot, d);
    b.owned = Tensor();
    b.device_owned = plan_.device_->make_buffer(bytes);
    b.view.dtype = slot.type.dtype;
    b.view.dims = std::move(d);
    b.view.data = b.device_owned.get();
    b.view.strings = nullptr;
    return b.view;
  }
  return host_output(i, slot, b, std::move(d));
}

ops::TensorView& StepContext::host_output(int i, const Slot& slot, Binding& b,
                                          std::vector<int64_t> d) {
  checked_bytes(i, slot, d);
  b.device_owned.reset();
  b.owned = Tensor(slot.type.dtype, d);
  b.view = view_of(b.owned);
  return b.view;
}

size_t StepContext::checked_bytes(int i, const Slot& slot, const std::vector<int64_t>& d) const {
  auto count = graph::checked_element_count(d, node().describe() + " output");
  auto bytes = graph::dtype_storage_bytes(slot.type.dtype, count);
  OT_CHECK(bytes && *bytes <= plan_.session_.opts_.max_tensor_bytes, node().describe(), ": output ",
           i, " of ", count, " elements exceeds the tensor size cap");
  OT_CHECK(slot.type.dtype != DataType::kUndefined, node().describe(), ": output ", i,
           " has no inferred dtype");
  return static_cast<size_t>(*bytes);
}

ops::TensorView& StepContext::output(int i) {
  OT_CHECK(has_output(i), node().describe(), ": output ", i, " is not requested");
  const Slot& slot = plan_.slots_[step_.out[i]];
  auto dims = concrete(slot.type);
  OT_CHECK(dims, node().describe(), ": output ", i,
           " shape is only known at run time; the kernel must pass dims");
  return output(i, *dims);
}

void* StepContext::scratch(size_t bytes) {
  // A device's kernels keep their own (their work may still be queued when the next node runs);
  // host kernels run to completion, so they share the plan's workspace.
  if (!native_) return plan_.host_workspace(bytes);
  return persistent_scratch(bytes);
}

void* StepContext::persistent_scratch(size_t bytes) {
  if (native_) {
    if (bytes > step_.device_scratch_bytes) {
      step_.device_scratch = plan_.device_->make_buffer(bytes);
      plan_.stats_.persistent_scratch_bytes +=
          static_cast<int64_t>(bytes - step_.device_scratch_bytes);
      step_.device_scratch_bytes = bytes;
    }
    return step_.device_scratch.get();
  }
  if (bytes > step_.scratch_bytes) {
    step_.scratch = plan_util::make_host_buffer(bytes);
    plan_util::touch_pages(step_.scratch.get(), bytes, 1);
    plan_.stats_.persistent_scratch_bytes += static_cast<int64_t>(bytes - step_.scratch_bytes);
    step_.scratch_bytes = bytes;
  }
  return step_.scratch.get();
}

void StepContext::parallel_for(int64_t n, int64_t grain,
                               const std::function<void(int64_t, int64_t)>& fn) const {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t chunks = std::min<int64_t>(threads_, (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  std::exception_ptr error;
  std::mutex mu;
#pragma omp parallel num_threads(static_cast <int>(chunks))
  {
    int64_t t = omp_get_thread_num(), k = omp_get_num_threads();
    int64_t begin = n * t / k, end = n * (t + 1) / k;
    try {
      if (begin < end) fn(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

ops::Subgraph& StepContext::subgraph(const std::string& attr) {
  std::shared_ptr<ops::Subgraph>& runner = step_.subgraphs[attr];
  if (!runner) {
    const graph::Attribute* a = node().find_attr(attr);
    OT_CHECK(a && a->type == graph::AttrType::kGraph, node().describe(), ": no graph attribute '",
             attr, "'");
    runner = std::make_shared<SubgraphRunner>(plan_, a->g(), node().describe() + " " + attr);
  }
  return *runner;
}

}  // namespace onnxtrain::runtime
