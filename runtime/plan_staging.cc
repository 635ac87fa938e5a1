// Plan staging: what moves between host and device memory — constants uploaded once, the
// caller's inputs bound (copied to the device in device mode), a staged CPU kernel's inputs
// downloaded and outputs uploaded, and the outputs of a run collected.
#include <cstring>
#include <utility>

#include "graph/error.h"
#include "runtime/plan.h"
#include "runtime/plan_util.h"

namespace onnxtrain::runtime {

using graph::DataType;
using graph::Tensor;
using plan_util::concrete;
using plan_util::view_of;

void Plan::bind_constant(int s, bool upload) {
  Slot& slot = slots_[s];
  if (!device_mode_) {
    slot.bind.view = view_of(slot.constant);
    return;
  }
  slot.host_view = view_of(slot.constant);
  if (!upload || slot.bind.device_owned) return;
  const Tensor& c = slot.constant;
  if (c.dtype() == DataType::kString) {
    slot.bind.view = slot.host_view;  // strings stay on the host; only staged steps read them
    return;
  }
  slot.bind.device_owned = device_->make_buffer(c.nbytes());
  device_->to_device(slot.bind.device_owned.get(), c.data(), c.nbytes());
  slot.bind.view = slot.host_view;
  slot.bind.view.data = slot.bind.device_owned.get();
}

void Plan::stage_inputs(Step& step, std::vector<std::pair<int, ops::TensorView>>& swapped) {
  auto stage = [&](int s) {
    Slot& slot = slots_[s];
    const ops::TensorView& v = slot.bind.view;
    if (slot.is_constant || v.dtype == DataType::kString) {
      if (!slot.is_constant) slot.host_view = v;  // strings live on the host
      return;
    }
    Tensor& t = slot.staged;
    if (t.dtype() != v.dtype || t.dims() != v.dims) t = Tensor(v.dtype, v.dims);
    if (t.nbytes()) device_->to_host(t.mutable_data(), v.data, t.nbytes());
    slot.host_view = view_of(t);
  };
  for (int s : step.in)
    if (s >= 0) stage(s);
  // A control-flow body reads what it captures through this plan's bindings: host copies
  // while the node runs (restored by the caller).
  for (const auto& a : step.node->attributes) {
    if (a.type != graph::AttrType::kGraph) continue;
    for (const graph::Value* v : a.g().captured_values()) {
      auto it = slot_index_.find(v);
      if (it == slot_index_.end()) continue;
      const int s = it->second;
      stage(s);
      swapped.emplace_back(s, slots_[s].bind.view);
      slots_[s].bind.view = slots_[s].host_view;
    }
  }
}

void Plan::upload_outputs(Step& step) {
  for (int s : step.out) {
    if (s < 0) continue;
    Slot& slot = slots_[s];
    Binding& b = slot.bind;
    if (b.view.dtype == DataType::kString || !b.owned.data()) continue;  // strings stay on the host
    std::byte* dst = nullptr;
    const auto planned = concrete(slot.type);
    if (slot.is_static && slot.arena_offset >= 0 && planned && *planned == b.view.dims) {
      dst = device_arena_.get() + slot.arena_offset;
    } else {
      b.device_owned = device_->make_buffer(b.owned.nbytes());
      dst = b.device_owned.get();
    }
    device_->to_device(dst, b.owned.data(), b.owned.nbytes());
    b.view.data = dst;
    b.owned = Tensor();
  }
  for (int s : step.in)
    if (s >= 0) slots_[s].staged = Tensor();
}

void Plan::bind_inputs(const std::map<std::string, const Tensor*>& inputs,
                       const ResidentMap& resident) {
  for (const auto& [name, t] : inputs) {
    const graph::Value* v = graph_.find_value(name);
    auto it = slot_index_.find(v);
    if (it == slot_index_.end()) continue;  // an input nothing reads
    Slot& slot = slots_[it->second];
    slot.bind.view = view_of(*t);
    if (!device_mode_ || t->dtype() == DataType::kString) continue;
    // A caller's tensor is copied to the device (into a buffer kept for the next run).
    if (slot.input_buffer_bytes != t->nbytes() || !slot.input_buffer) {
      slot.input_buffer = device_->make_buffer(t->nbytes());
      slot.input_buffer_bytes = t->nbytes();
    }
    device_->to_device(slot.input_buffer.get(), t->data(), t->nbytes());
    slot.bind.view.data = slot.input_buffer.get();
  }
  for (const auto& [name, t] : resident) {
    auto it = slot_index_.find(graph_.find_value(name));
    if (it == slot_index_.end()) continue;
    ops::TensorView& view = slots_[it->second].bind.view;
    view.dtype = t->dtype;
    view.dims = t->dims;
    view.data = t->data.get();
    view.strings = nullptr;
  }
}

std::vector<Tensor> Plan::collect_outputs() {
  std::vector<Tensor> out;
  for (const graph::Value* v : graph_.outputs()) {
    const int si = slot_index_.at(v);
    const Slot& slot = slots_[si];
    const ops::TensorView& view = slot.bind.view;
    if (slot.alias_input >= 0) {
      // The new value goes into the aliased input's buffer (if the kernel did not write it).
      const ops::TensorView& target = slots_[slot.alias_input].bind.view;
      const void* src = slot.is_constant ? slot.constant.data() : view.data;
      OT_CHECK(slot.is_constant ? slot.constant.dims() == target.dims : view.dims == target.dims,
               "output '", v->name(), "' has other dims than the input it updates");
      if (!slot.alias_direct && src != target.data && target.nbytes()) {
        if (!device_mode_)
          std::memcpy(target.data, src, target.nbytes());
        else if (slot.is_constant)
          device_->to_device(target.data, src, target.nbytes());
        else
          device_->on_device(target.data, src, target.nbytes());
      }
      out.emplace_back();
      continue;
    }
    if (slot.is_constant) {
      out.push_back(slot.constant);
      continue;
    }
    OT_CHECK(view.dtype != DataType::kUndefined, "output '", v->name(), "' was not computed");
    Tensor t(view.dtype, view.dims);
    if (view.dtype == DataType::kString) {
      if (view.strings) t.mutable_strings() = *view.strings;
    } else if (t.nbytes() && device_mode_) {
      device_->to_host(t.mutable_data(), view.data, t.nbytes());
    } else if (t.nbytes()) {
      std::memcpy(t.mutable_data(), view.data, t.nbytes());
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace onnxtrain::runtime
