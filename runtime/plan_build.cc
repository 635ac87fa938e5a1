// Plan construction: slots for the graph's values, shape inference with concrete dims,
// constant folding, kernel choice (device or staged CPU kernel), in-place output aliases, the
// memory plan and kernel preparation. Running is plan_exec.cc (folding runs a node through it).
#include <algorithm>
#include <utility>

#include "graph/error.h"
#include "graph/printer.h"
#include "ops/infer.h"
#include "runtime/memory_plan.h"
#include "runtime/plan.h"
#include "runtime/plan_util.h"
#include "runtime/step_context.h"

namespace onnxtrain::runtime {

using graph::DataType;
using graph::Tensor;
using graph::ValueType;
using plan_util::concrete;
using plan_util::make_host_buffer;

int Plan::slot_of(const graph::Value* v) {
  auto it = slot_index_.find(v);
  if (it != slot_index_.end()) return it->second;
  int id = static_cast<int>(slots_.size());
  Slot s;
  s.value = v;
  s.type = v->type;
  slots_.push_back(std::move(s));
  slot_index_[v] = id;
  return id;
}

Plan::Plan(InferenceSession& session, const std::map<std::string, const Tensor*>& inputs,
           const ResidentMap& resident)
    : session_(session), model_(*session.model_), graph_(*session.model_->graph) {
  device_ = session.opts_.device ? session.opts_.device : cpu_device();
  device_mode_ = !device_->host_memory();
  if (device_mode_) device_->activate();
  build(inputs, resident);
}

Plan::Plan(InferenceSession& session, const graph::Graph& g, Plan* parent,
           const std::map<std::string, const Tensor*>& inputs)
    : session_(session), model_(*session.model_), graph_(g), parent_(parent) {
  // Bodies run on the host: their node is a staged step on a device, which hands them host
  // copies of what they capture (Plan::stage_inputs).
  device_ = cpu_device();
  // Captured outer values: constants stay constants (so they fold here too); the rest are
  // bound from the parent's buffers on every run, with the dims they have now.
  for (const graph::Value* v : g.captured_values()) {
    auto it = parent->slot_index_.find(v);
    OT_CHECK(it != parent->slot_index_.end(), "subgraph '", g.name, "': captured value '",
             v->name(), "' is not available in the enclosing graph");
    const Slot& ps = parent->slots_[it->second];
    int s = slot_of(v);
    if (ps.is_constant) {
      slots_[s].is_constant = true;
      slots_[s].constant = ps.constant;
      slots_[s].type = ps.type;
      continue;
    }
    const ops::TensorView& view = parent->slots_[it->second].bind.view;
    OT_CHECK(view.dtype != DataType::kUndefined, "subgraph '", g.name, "': captured value '",
             v->name(), "' has not been computed");
    slots_[s].is_input = true;
    slots_[s].type = ValueType::tensor(view.dtype, graph::make_shape(view.dims));
    captures_.emplace_back(s, it->second);
  }
  build(inputs, {});
}

void Plan::build(const std::map<std::string, const Tensor*>& inputs, const ResidentMap& resident) {
  default_opset_ = model_.opset_version("").value_or(1);
  const graph::Graph& g = graph_;
  // Graph inputs take the caller's dims; initializers are constants.
  for (const graph::Value* v : g.inputs()) {
    auto it = inputs.find(v->name());
    if (it == inputs.end()) continue;  // initializer-backed default
    int s = slot_of(v);
    slots_[s].is_input = true;
    std::vector<int64_t> dims = it->second->dims();
    slots_[s].type = ValueType::tensor(it->second->dtype(), graph::make_shape(dims));
  }
  for (const auto& [name, t] : resident) {
    const graph::Value* v = g.find_value(name);
    OT_CHECK(v && v->is_graph_input(), "resident input '", name, "' is not a graph input");
    int s = slot_of(v);
    slots_[s].is_input = true;
    slots_[s].type = ValueType::tensor(t->dtype, graph::make_shape(t->dims));
  }
  for (const graph::Value* v : g.initializers()) {
    if (inputs.count(v->name()) || resident.count(v->name())) continue;
    int s = slot_of(v);
    slots_[s].is_constant = true;
    slots_[s].constant = v->initializer();
    std::vector<int64_t> dims = v->initializer().dims();
    slots_[s].type = ValueType::tensor(v->initializer().dtype(), graph::make_shape(dims));
  }
  for (const graph::Node* n : g.topological_order()) fold_or_schedule(*n);
  for (const graph::Value* v : g.outputs()) {
    auto it = slot_index_.find(v);
    OT_CHECK(it != slot_index_.end(), "graph '", g.name, "': output '", v->name(),
             "' has no value (a graph input not given?)");
    slots_[it->second].is_output = true;
    slots_[it->second].last_use = static_cast<int>(steps_.size());
  }
  for (size_t s = 0; s < slots_.size(); ++s)
    if (slots_[s].is_constant) bind_constant(static_cast<int>(s));
  if (!parent_) plan_aliases();
  plan_memory();
  prepare_kernels();
  // The first run costs what every later one does (issue #18): the kernels are prepared
  // (primitives made, workspace sized), and the arena's and workspace's pages were touched when
  // allocated (GrowingBuffer), not by the first run's page faults.
}

std::shared_ptr<plan_util::GrowingBuffer> Plan::host_buffer(
    std::shared_ptr<plan_util::GrowingBuffer>& shared) {
  if (parent_) return std::make_shared<plan_util::GrowingBuffer>();  // runs inside its parent's run
  if (!shared) shared = std::make_shared<plan_util::GrowingBuffer>();
  return shared;
}

std::byte* Plan::host_workspace(size_t bytes) {
  if (!workspace_) workspace_ = host_buffer(session_.host_workspace_);
  stats_.workspace_bytes = std::max(stats_.workspace_bytes, static_cast<int64_t>(bytes));
  return workspace_->at_least(bytes, session_.opts_.threads);
}

void Plan::plan_aliases() {
  std::vector<char> taken(slots_.size(), 0);
  for (const auto& [out_name, in_name] : session_.opts_.output_aliases) {
    const graph::Value* ov = graph_.find_value(out_name);
    const graph::Value* iv = graph_.find_value(in_name);
    OT_CHECK(ov && ov->is_graph_output(), "output alias: '", out_name, "' is not a graph output");
    OT_CHECK(iv && iv->is_graph_input(), "output alias: '", in_name, "' is not a graph input");
    auto oi = slot_index_.find(ov), ii = slot_index_.find(iv);
    OT_CHECK(ii != slot_index_.end() && slots_[ii->second].is_input, "output alias: input '",
             in_name, "' is not bound in this run");
    const int so = oi->second, si = ii->second;
    OT_CHECK(!taken[si], "output alias: input '", in_name, "' is the target of two outputs");
    taken[si] = 1;
    Slot& out = slots_[so];
    const Slot& in = slots_[si];
    const auto od = concrete(out.type), id = concrete(in.type);
    OT_CHECK(out.type.dtype == in.type.dtype && in.type.dtype != DataType::kString &&
                 (!od || !id || *od == *id),
             "output alias: '", out_name, "' ", graph::format_type(out.type), " cannot update '",
             in_name, "' ", graph::format_type(in.type));
    out.alias_input = si;
    if (out.is_constant || out.def_step < 0 || !out.is_static || !id || so == si) {
      ++stats_.aliased_copied;
      continue;
    }
    // Direct write: the producer declares the pair in place and reads the input only there, or
    // does not read the input at all (the master's update writing its kept bf16 copy,
    // passes::keep_weight_copies); and no later node reads the input (it would see the new
    // value).
    const Step& w = steps_[static_cast<size_t>(out.def_step)];
    int out_pos = -1;
    for (size_t k = 0; k < w.out.size(); ++k)
      if (w.out[k] == so) out_pos = static_cast<int>(k);
    const int in_pos = w.schema->inplace ? w.schema->inplace(*w.node, out_pos) : -1;
    const bool reads_input = std::find(w.in.begin(), w.in.end(), si) != w.in.end();
    bool direct = !w.on_host && (!reads_input || (in_pos >= 0 &&
                                                  in_pos < static_cast<int>(w.in.size()) &&
                                                  w.in[in_pos] == si));
    for (size_t k = 0; direct && k < w.in.size(); ++k)
      if (static_cast<int>(k) != in_pos && w.in[k] == si) direct = false;
    for (size_t k = static_cast<size_t>(out.def_step) + 1; direct && k < steps_.size(); ++k) {
      for (int s : steps_[k].in)
        if (s == si) direct = false;
      for (const auto& a : steps_[k].node->attributes)
        if (a.type == graph::AttrType::kGraph || a.type == graph::AttrType::kGraphs) direct = false;
    }
    out.alias_direct = direct;
    ++(direct ? stats_.aliased_in_place : stats_.aliased_copied);
  }
}

void Plan::choose_kernel(Step& step) {
  const graph::Node& n = *step.node;
  bool host = step.dynamic;
  for (const auto& a : n.attributes)
    host = host || a.type == graph::AttrType::kGraph || a.type == graph::AttrType::kGraphs;
  for (int s : step.in) host = host || (s >= 0 && slots_[s].type.dtype == DataType::kString);
  for (int s : step.out) host = host || (s >= 0 && slots_[s].type.dtype == DataType::kString);
  if (!host) step.kernel = device_->device_kernel(*step.schema, n);
  step.on_host = !step.kernel;
  if (step.on_host) step.kernel = step.schema->cpu_kernel(n);
}

void Plan::fall_back_to_host(Step& step) {
  step.kernel = step.schema->cpu_kernel(*step.node);
  step.on_host = true;
  step.device_scratch.reset();
  step.device_scratch_bytes = 0;
  // Its outputs can no longer be written over the state they update: copy at the end instead.
  for (int s : step.out)
    if (s >= 0 && slots_[s].alias_direct) {
      slots_[s].alias_direct = false;
      --stats_.aliased_in_place;
      ++stats_.aliased_copied;
    }
}

void Plan::infer_step(const graph::Node& n, std::vector<int>& in, ops::InferenceContext& ictx) {
  for (const graph::Value* v : n.inputs()) {
    if (!v) {
      in.push_back(-1);
      ictx.input_types.push_back(nullptr);
      ictx.input_values.push_back(nullptr);
      continue;
    }
    auto it = slot_index_.find(v);
    OT_CHECK(it != slot_index_.end(), n.describe(), ": input '", v->name(),
             "' has no value (a graph input not given?)");
    int s = it->second;
    in.push_back(s);
    ictx.input_types.push_back(&slots_[s].type);
    ictx.input_values.push_back(slots_[s].is_constant ? &slots_[s].constant : nullptr);
  }
  ictx.output_types.resize(n.outputs().size());
  ictx.output_values.resize(n.outputs().size());
}

void Plan::fold_or_schedule(const graph::Node& n) {
  int64_t opset = model_.opset_version(n.domain).value_or(1);
  const ops::OpSchema* schema = ops::OpRegistry::global().find(n.domain, n.op_type, opset);
  OT_CHECK(schema && schema->cpu_kernel, n.describe(), ": no CPU kernel for ",
           n.domain.empty() ? "" : n.domain + ".", n.op_type, " at opset ", opset);
  Step step;
  step.node = &n;
  step.schema = schema;
  ops::InferenceContext ictx{n, opset, {}, {}, {}, {}};
  ictx.default_opset = default_opset_;
  infer_step(n, step.in, ictx);
  ops::run_inference(*schema, ictx);
  OT_CHECK(ictx.output_types.size() >= n.outputs().size(), n.describe(),
           ": inference produced too few outputs");

  bool all_values = true;
  for (size_t i = 0; i < n.outputs().size(); ++i) {
    if (!n.outputs()[i]) {
      step.out.push_back(-1);
      continue;
    }
    int s = slot_of(n.outputs()[i]);
    step.out.push_back(s);
    Slot& slot = slots_[s];
    slot.type = ictx.output_types[i];
    slot.def_step = static_cast<int>(steps_.size());
    if (auto dims = concrete(slot.type)) {
      auto count = graph::checked_element_count(*dims, n.describe() + " output");
      auto bytes = graph::dtype_storage_bytes(slot.type.dtype, count);
      OT_CHECK(bytes && *bytes <= session_.opts_.max_tensor_bytes, n.describe(), ": output '",
               slot.value->name(), "' would need ", count, " elements, above the tensor size cap");
      slot.is_static = slot.type.dtype != DataType::kString;
      slot.bytes = static_cast<size_t>(*bytes);
    } else {
      step.dynamic = true;
    }
    if (i < ictx.output_values.size() && ictx.output_values[i]) {
      slot.is_constant = true;
      slot.constant = std::move(*ictx.output_values[i]);
    } else {
      all_values = false;
    }
  }
  // Known outputs need no kernel, and neither does a node without outputs, unless it acts on
  // something else (not foldable: the root's side of a Broadcast sends to the other replicas).
  const bool any_output =
      std::any_of(n.outputs().begin(), n.outputs().end(), [](const graph::Value* v) { return v; });
  if (all_values && (any_output || schema->foldable)) {
    ++stats_.folded_nodes;
    return;
  }
  bool inputs_constant = true;
  for (int s : step.in)
    if (s >= 0 && !slots_[s].is_constant) inputs_constant = false;
  if (inputs_constant && schema->foldable && !n.inputs().empty()) {
    // Compute once now; the result becomes a constant of the plan.
    step.kernel = schema->cpu_kernel(n);
    step.on_host = device_mode_;
    for (int s : step.in)
      if (s >= 0) bind_constant(s, /*upload=*/false);
    execute(step, -1, true);
    for (int s : step.out) {
      if (s < 0) continue;
      Slot& slot = slots_[s];
      Binding& b = slot.bind;
      slot.is_constant = true;
      slot.constant = std::move(b.owned);
      std::vector<int64_t> dims = slot.constant.dims();
      slot.type = ValueType::tensor(slot.constant.dtype(), graph::make_shape(dims));
      b = Binding{};
    }
    ++stats_.folded_nodes;
    return;
  }
  int index = static_cast<int>(steps_.size());
  for (int s : step.in)
    if (s >= 0) slots_[s].last_use = std::max(slots_[s].last_use, index);
  // Values the node's bodies capture are read while it runs: keep them alive until then.
  for (const auto& a : n.attributes) {
    if (a.type != graph::AttrType::kGraph) continue;
    for (const graph::Value* v : a.g().captured_values()) {
      auto it = slot_index_.find(v);
      OT_CHECK(it != slot_index_.end(), n.describe(), ": attribute '", a.name, "' captures '",
               v->name(), "', which has no value here");
      slots_[it->second].last_use = std::max(slots_[it->second].last_use, index);
    }
  }
  for (int s : step.out)
    if (s >= 0) slots_[s].is_constant = false;
  if (device_mode_)
    choose_kernel(step);
  else
    step.kernel = schema->cpu_kernel(n);
  if (step.dynamic) ++stats_.dynamic_nodes;
  ++stats_.kernel_nodes;
  steps_.push_back(std::move(step));
}

bool Plan::arena_intermediate(int s) const {
  if (s < 0) return false;
  const Slot& slot = slots_[static_cast<size_t>(s)];
  return slot.is_static && !slot.is_constant && !slot.is_input && !slot.is_output &&
         !slot.alias_direct && slot.def_step >= 0;
}

std::vector<int> Plan::view_roots() const {
  std::vector<int> root(slots_.size(), -1);
  // Steps run in order and no kernel writes a buffer it does not own as an output (the in-place
  // exceptions, state aliases and packed blocks, are kept out of views), so a buffer shared by
  // a chain of views holds the same elements for as long as any of them is live.
  for (const Step& step : steps_) {
    if (!step.schema->view || step.dynamic || step.on_host || step.in.empty() || step.out.empty())
      continue;
    const int si = step.in[0], so = step.out[0];
    if (si == so || !arena_intermediate(si) || !arena_intermediate(so)) continue;
    const Slot &in = slots_[static_cast<size_t>(si)], &out = slots_[static_cast<size_t>(so)];
    if (in.bytes != out.bytes || in.type.dtype != out.type.dtype) continue;
    int& r = root[static_cast<size_t>(si)];
    if (r < 0) r = si;
    root[static_cast<size_t>(so)] = r;
  }
  return root;
}

std::vector<Plan::PackedBlock> Plan::packed_blocks(const std::vector<char>& excluded) const {
  std::vector<PackedBlock> blocks;
  // Host plans only: the CUDA AllReduce packs its own device copy (a device-local copy at
  // device bandwidth), so blocks there would only keep gradients alive longer.
  if (device_mode_) return blocks;
  std::vector<char> taken = excluded;
  // An arena slot this step may place: an intermediate with known dims, not already placed.
  auto placeable = [&](int s) { return arena_intermediate(s) && !taken[static_cast<size_t>(s)]; };
  for (size_t k = 0; k < steps_.size(); ++k) {
    const Step& step = steps_[k];
    if (!step.schema->packed_inputs || step.dynamic || step.on_host ||
        !step.schema->packed_inputs(*step.node))
      continue;
    PackedBlock b;
    b.def = static_cast<int>(k);
    b.last = static_cast<int>(k);
    bool ok = step.out.size() >= step.in.size();
    for (size_t i = 0; ok && i < step.in.size(); ++i) {
      const int si = step.in[i];
      if (si < 0) continue;
      const int so = step.out[i];
      // The input is read by no later node (it would see the result), and is not also another
      // input of this node; the output is this step's, of the same size.
      ok = placeable(si) && placeable(so) && si != so &&
           slots_[static_cast<size_t>(si)].last_use == static_cast<int>(k) &&
           slots_[static_cast<size_t>(so)].def_step == static_cast<int>(k) &&
           slots_[static_cast<size_t>(so)].bytes == slots_[static_cast<size_t>(si)].bytes;
      for (const PackedBlock::Member& m : b.members) ok = ok && m.in != si;
      if (!ok) break;
      const Slot& in = slots_[static_cast<size_t>(si)];
      const Slot& out = slots_[static_cast<size_t>(so)];
      b.members.push_back({si, so, static_cast<int64_t>(b.bytes)});
      b.bytes += ops::packed_input_bytes(in.bytes);
      b.def = std::min(b.def, in.def_step);
      b.last = std::max(b.last, std::max(out.last_use, out.def_step));
    }
    if (!ok || b.members.empty()) continue;
    for (const PackedBlock::Member& m : b.members) {
      taken[static_cast<size_t>(m.in)] = 1;
      taken[static_cast<size_t>(m.out)] = 1;
    }
    blocks.push_back(std::move(b));
  }
  return blocks;
}

void Plan::plan_memory() {
  // The static intermediates get arena offsets from their live ranges (memory_plan.h). The
  // inputs and outputs of a step whose op packs its inputs (OpSchema::packed_inputs) are one
  // buffer, live from the first input's producer to the last output's reader.
  // A view (OpSchema::view) shares its input's buffer: one buffer per chain of views, live
  // from the first value's producer to the last reader of any of them. Values in views take no
  // part in packed blocks (a block places its members itself and overwrites its inputs in
  // place: neither may move or change a buffer that other values of the chain still read).
  static_assert(kArenaAlign % ops::kPackedInputAlign == 0);
  const std::vector<int> roots = view_roots();
  std::vector<char> in_view(slots_.size(), 0);
  std::vector<int> view_last(slots_.size(), -1);
  for (size_t s = 0; s < slots_.size(); ++s) {
    const int r = roots[s];
    if (r < 0) continue;
    in_view[s] = 1;
    const Slot& slot = slots_[s];
    int& last = view_last[static_cast<size_t>(r)];
    last = std::max({last, slot.last_use, slot.def_step});
    if (r != static_cast<int>(s)) ++stats_.view_nodes;
  }
  const std::vector<PackedBlock> blocks = packed_blocks(in_view);
  std::vector<char> in_block(slots_.size(), 0);
  for (const PackedBlock& b : blocks)
    for (const PackedBlock::Member& m : b.members) {
      in_block[static_cast<size_t>(m.in)] = 1;
      in_block[static_cast<size_t>(m.out)] = 1;
    }
  std::vector<int> order;
  std::vector<BufferLife> lives;
  for (size_t s = 0; s < slots_.size(); ++s) {
    Slot& slot = slots_[s];
    if (slot.is_static && !slot.is_constant && !slot.is_input && slot.def_step >= 0 &&
        !slot.alias_direct) {
      if (slot.last_use < slot.def_step) slot.last_use = slot.def_step;  // unused output
      if (in_block[s]) continue;
      const int r = roots[s];
      if (r >= 0 && r != static_cast<int>(s)) continue;  // placed with its chain's first value
      order.push_back(static_cast<int>(s));
      lives.push_back({slot.bytes, slot.def_step, r >= 0 ? view_last[s] : slot.last_use});
    }
  }
  for (const PackedBlock& b : blocks) lives.push_back({b.bytes, b.def, b.last});
  const MemoryLayout layout = runtime::plan_memory(lives);
  stats_.unshared_bytes += layout.unshared_bytes;
  stats_.arena_bytes = layout.arena_bytes;
  stats_.packed_blocks = static_cast<int>(blocks.size());
  const auto arena = static_cast<size_t>(layout.arena_bytes);
  if (arena > 0 && device_mode_) {
    device_arena_ = device_->make_buffer(arena);
  } else if (!device_mode_) {
    arena_ = host_buffer(session_.host_arena_);
    arena_->at_least(arena, session_.opts_.threads);
  }
  auto place = [&](int s, int64_t offset) {
    Slot& slot = slots_[static_cast<size_t>(s)];
    slot.arena_offset = offset;
    Binding& b = slot.bind;
    b.view.dtype = slot.type.dtype;
    b.view.dims = *concrete(slot.type);
    b.view.data = (device_mode_ ? device_arena_.get() : host_arena()) + slot.arena_offset;
  };
  for (size_t k = 0; k < order.size(); ++k) place(order[k], layout.offsets[k]);
  for (size_t s = 0; s < slots_.size(); ++s)
    if (roots[s] >= 0 && roots[s] != static_cast<int>(s))
      place(static_cast<int>(s), slots_[static_cast<size_t>(roots[s])].arena_offset);
  for (size_t k = 0; k < blocks.size(); ++k)
    for (const PackedBlock::Member& m : blocks[k].members) {
      const int64_t offset = layout.offsets[order.size() + k] + m.offset;
      place(m.in, offset);
      place(m.out, offset);
    }
  // Dynamic buffers are released after their last reader.
  release_after_.assign(steps_.size(), {});
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    if (slot.arena_offset < 0 && !slot.is_constant && !slot.is_input && !slot.is_output &&
        slot.def_step >= 0) {
      int last = std::max(slot.last_use, slot.def_step);
      if (last >= 0 && last < static_cast<int>(steps_.size()))
        release_after_[last].push_back(static_cast<int>(s));
    }
  }
}

void Plan::prepare_kernels() {
  int threads = session_.opts_.threads;
  for (auto& step : steps_) {
    if (step.dynamic) continue;  // prepared at run time once dims are known
    bool inputs_known = true;
    for (int s : step.in)
      if (s >= 0 && !concrete(slots_[s].type)) inputs_known = false;
    if (!inputs_known) {
      step.dynamic = true;
      if (device_mode_ && !step.on_host) fall_back_to_host(step);
      continue;
    }
    // Inputs bound to the caller are not known yet: give the kernel their dims only.
    std::vector<std::pair<int, ops::TensorView>> saved;
    for (int s : step.in)
      if (s >= 0 && slots_[s].is_input) {
        saved.emplace_back(s, slots_[s].bind.view);
        slots_[s].bind.view.dtype = slots_[s].type.dtype;
        slots_[s].bind.view.dims = *concrete(slots_[s].type);
      }
    try {
      if (device_mode_ && !step.on_host) {
        try {
          StepContext ctx(*this, step, threads);
          step.kernel->prepare(ctx);
        } catch (const ops::DeviceFallback&) {
          fall_back_to_host(step);
        }
      }
      if (step.on_host || !device_mode_) {
        // A staged step sees host views: constants' data, the others' dims only (for now).
        if (device_mode_)
          for (int s : step.in)
            if (s >= 0 && !slots_[s].is_constant) {
              slots_[s].host_view = slots_[s].bind.view;
              slots_[s].host_view.data = nullptr;
            }
        StepContext ctx(*this, step, threads);
        step.kernel->prepare(ctx);
      }
    } catch (const Error& e) {
      fail(e.what());
    }
    for (auto& [s, v] : saved) slots_[s].bind.view = v;
  }
  for (const Step& step : steps_) {
    if (!device_mode_) break;
    ++(step.on_host ? stats_.staged_nodes : stats_.device_nodes);
  }
}

}  // namespace onnxtrain::runtime
