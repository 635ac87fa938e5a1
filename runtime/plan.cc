// Plan construction (inference, folding, memory plan, kernel preparation) and execution.
#include "runtime/plan.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>

#include "graph/error.h"
#include "graph/printer.h"
#include "runtime/comm/communicator.h"
#include "ops/infer.h"

namespace onnxtrain::runtime {
namespace {

using graph::DataType;
using graph::Tensor;
using graph::ValueType;

constexpr size_t kAlign = 64;

size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::optional<std::vector<int64_t>> concrete(const ValueType& t) {
  if (t.kind != ValueType::Kind::kTensor || !t.shape) return std::nullopt;
  std::vector<int64_t> out;
  for (const auto& d : *t.shape) {
    if (!d.is_known()) return std::nullopt;
    out.push_back(d.value);
  }
  return out;
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

ops::TensorView view_of(const Tensor& t) {
  ops::TensorView v;
  v.dtype = t.dtype();
  v.dims = t.dims();
  v.data = const_cast<std::byte*>(t.data());
  if (t.dtype() == DataType::kString)
    v.strings = const_cast<std::vector<std::string>*>(&t.strings());
  return v;
}

}  // namespace

// ---------------------------------------------------------------- kernel context

class StepContext final : public ops::KernelContext {
 public:
  StepContext(Plan& plan, Step& step, int threads)
      : plan_(plan), step_(step), threads_(threads),
        staged_(plan.device_mode_ && step.on_host), native_(plan.device_mode_ && !step.on_host) {}

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
    if (staged_) return &plan_.host_views_[step_.in[i]];
    return &plan_.bindings_[step_.in[i]].view;
  }
  const ops::TensorView* host_constant(int i) const override {
    if (!input_is_constant(i)) return nullptr;
    return plan_.device_mode_ ? &plan_.host_views_[step_.in[i]] : input(i);
  }
  bool input_is_constant(int i) const override {
    return i >= 0 && i < num_inputs() && step_.in[i] >= 0 && plan_.slots_[step_.in[i]].is_constant;
  }
  int num_outputs() const override { return static_cast<int>(step_.out.size()); }
  bool has_output(int i) const override {
    return i >= 0 && i < num_outputs() && step_.out[i] >= 0;
  }
  ops::TensorView& output(int i, std::span<const int64_t> dims) override {
    OT_CHECK(has_output(i), node().describe(), ": output ", i, " is not requested");
    int s = step_.out[i];
    Slot& slot = plan_.slots_[s];
    Plan::Binding& b = plan_.bindings_[s];
    std::vector<int64_t> d(dims.begin(), dims.end());
    if (staged_) return host_output(i, slot, b, std::move(d));
    if (slot.alias_direct) {
      // Written over the aliased input (training state updated in place).
      const ops::TensorView& target = plan_.bindings_[slot.alias_input].view;
      OT_CHECK(target.dims == d && target.dtype == slot.type.dtype, node().describe(),
               ": output ", i, " does not match the input it updates in place");
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
        b.view.data = (native_ ? plan_.device_arena_.get() : plan_.arena_.get()) + slot.arena_offset;
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
  // A host buffer for output i: off-plan values on the CPU, every output of a staged step (the
  // plan copies it to the device after the kernel ran).
  ops::TensorView& host_output(int i, const Slot& slot, Plan::Binding& b, std::vector<int64_t> d) {
    checked_bytes(i, slot, d);
    b.device_owned.reset();
    b.owned = Tensor(slot.type.dtype, d);
    b.view = view_of(b.owned);
    return b.view;
  }
  size_t checked_bytes(int i, const Slot& slot, const std::vector<int64_t>& d) const {
    auto count = graph::checked_element_count(d, node().describe() + " output");
    auto bytes = graph::dtype_storage_bytes(slot.type.dtype, count);
    OT_CHECK(bytes && *bytes <= plan_.session_.opts_.max_tensor_bytes, node().describe(),
             ": output ", i, " of ", count, " elements exceeds the tensor size cap");
    OT_CHECK(slot.type.dtype != DataType::kUndefined, node().describe(), ": output ", i,
             " has no inferred dtype");
    return static_cast<size_t>(*bytes);
  }
  ops::TensorView& output(int i) override {
    OT_CHECK(has_output(i), node().describe(), ": output ", i, " is not requested");
    const Slot& slot = plan_.slots_[step_.out[i]];
    auto dims = concrete(slot.type);
    OT_CHECK(dims, node().describe(), ": output ", i,
             " shape is only known at run time; the kernel must pass dims");
    return output(i, *dims);
  }
  // Grows the step's buffer; a second call in the same run() may move it.
  void* scratch(size_t bytes) override {
    if (native_) {
      if (bytes > step_.device_scratch_bytes) {
        step_.device_scratch = plan_.device_->make_buffer(bytes);
        step_.device_scratch_bytes = bytes;
      }
      return step_.device_scratch.get();
    }
    if (bytes > step_.scratch_bytes) {
      auto* p = static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{kAlign}));
      step_.scratch = std::shared_ptr<std::byte[]>(
          p, [](std::byte* q) { ::operator delete[](q, std::align_val_t{kAlign}); });
      step_.scratch_bytes = bytes;
    }
    return step_.scratch.get();
  }
  ops::DeviceKind device() const override {
    return native_ ? plan_.device_->kind() : ops::DeviceKind::kCpu;
  }
  void* stream() const override { return native_ ? plan_.device_->stream() : nullptr; }
  int num_threads() const override { return threads_; }
  uint64_t random_seed() const override { return plan_.session_.random_seed_; }
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& fn) const override {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    int64_t chunks = std::min<int64_t>(threads_, (n + grain - 1) / grain);
    if (chunks <= 1) {
      fn(0, n);
      return;
    }
    std::exception_ptr error;
    std::mutex mu;
#pragma omp parallel num_threads(static_cast<int>(chunks))
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
  ops::Subgraph& subgraph(const std::string& attr) override {
    std::shared_ptr<ops::Subgraph>& runner = step_.subgraphs[attr];
    if (!runner) {
      const graph::Attribute* a = node().find_attr(attr);
      OT_CHECK(a && a->type == graph::AttrType::kGraph, node().describe(),
               ": no graph attribute '", attr, "'");
      runner = std::make_shared<SubgraphRunner>(plan_, a->g(), node().describe() + " " + attr);
    }
    return *runner;
  }

 private:
  Plan& plan_;
  Step& step_;
  int threads_;
  bool staged_;  // device mode, CPU kernel: host copies in and out
  bool native_;  // device mode, device kernel: device memory
};

// ---------------------------------------------------------------- construction

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
    const ops::TensorView& view = parent->bindings_[it->second].view;
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
  bindings_.resize(slots_.size());
  for (const graph::Node* n : g.topological_order()) fold_or_schedule(*n);
  for (const graph::Value* v : g.outputs()) {
    auto it = slot_index_.find(v);
    OT_CHECK(it != slot_index_.end(), "graph '", g.name, "': output '", v->name(),
             "' has no value (a graph input not given?)");
    slots_[it->second].is_output = true;
    slots_[it->second].last_use = static_cast<int>(steps_.size());
  }
  bindings_.resize(slots_.size());
  host_views_.resize(slots_.size());
  for (size_t s = 0; s < slots_.size(); ++s)
    if (slots_[s].is_constant) bind_constant(static_cast<int>(s));
  if (!parent_) plan_aliases();
  plan_memory();
  prepare_kernels();
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
    // Direct write: the producer declares the pair in place, reads the input only there, and
    // no later node reads the input (it would see the new value).
    const Step& w = steps_[static_cast<size_t>(out.def_step)];
    int out_pos = -1;
    for (size_t k = 0; k < w.out.size(); ++k)
      if (w.out[k] == so) out_pos = static_cast<int>(k);
    const int in_pos = w.schema->inplace ? w.schema->inplace(*w.node, out_pos) : -1;
    bool direct = in_pos >= 0 && in_pos < static_cast<int>(w.in.size()) && w.in[in_pos] == si &&
                  !w.on_host;
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

void Plan::bind_constant(int s, bool upload) {
  if (!device_mode_) {
    bindings_[s].view = view_of(slots_[s].constant);
    return;
  }
  if (host_views_.size() < slots_.size()) host_views_.resize(slots_.size());
  host_views_[s] = view_of(slots_[s].constant);
  if (!upload || bindings_[s].device_owned) return;
  const Tensor& c = slots_[s].constant;
  if (c.dtype() == DataType::kString) {
    bindings_[s].view = host_views_[s];  // strings stay on the host; only staged steps read them
    return;
  }
  bindings_[s].device_owned = device_->make_buffer(c.nbytes());
  device_->to_device(bindings_[s].device_owned.get(), c.data(), c.nbytes());
  bindings_[s].view = host_views_[s];
  bindings_[s].view.data = bindings_[s].device_owned.get();
}

void Plan::choose_kernel(Step& step) {
  const graph::Node& n = *step.node;
  bool host = step.dynamic;
  for (const auto& a : n.attributes)
    host = host || a.type == graph::AttrType::kGraph || a.type == graph::AttrType::kGraphs;
  for (int s : step.in)
    host = host || (s >= 0 && slots_[s].type.dtype == DataType::kString);
  for (int s : step.out)
    host = host || (s >= 0 && slots_[s].type.dtype == DataType::kString);
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
  bindings_.resize(slots_.size());
  if (all_values) {
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
      Binding& b = bindings_[s];
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

void Plan::plan_memory() {
  // Greedy: biggest buffers first, each at the lowest offset free over its live range.
  struct Placed {
    int64_t offset;
    size_t bytes;
    int def, last;
  };
  std::vector<int> order;
  for (size_t s = 0; s < slots_.size(); ++s) {
    Slot& slot = slots_[s];
    if (slot.is_static && !slot.is_constant && !slot.is_input && slot.def_step >= 0 &&
        !slot.alias_direct) {
      if (slot.last_use < slot.def_step) slot.last_use = slot.def_step;  // unused output
      order.push_back(static_cast<int>(s));
      stats_.unshared_bytes += static_cast<int64_t>(round_up(slot.bytes));
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return slots_[a].bytes > slots_[b].bytes; });
  std::vector<Placed> placed;
  int64_t arena = 0;
  for (int s : order) {
    Slot& slot = slots_[s];
    size_t need = round_up(std::max<size_t>(slot.bytes, 1));
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const Placed& p : placed)
      if (p.def <= slot.last_use && slot.def_step <= p.last)
        busy.emplace_back(p.offset, p.offset + static_cast<int64_t>(p.bytes));
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (const auto& [b, e] : busy) {
      if (offset + static_cast<int64_t>(need) <= b) break;
      offset = std::max(offset, e);
    }
    slot.arena_offset = offset;
    placed.push_back({offset, need, slot.def_step, slot.last_use});
    arena = std::max(arena, offset + static_cast<int64_t>(need));
  }
  stats_.arena_bytes = arena;
  if (arena > 0 && device_mode_) {
    device_arena_ = device_->make_buffer(static_cast<size_t>(arena));
  } else if (arena > 0) {
    auto* p = static_cast<std::byte*>(::operator new[](static_cast<size_t>(arena), std::align_val_t{kAlign}));
    arena_ = std::shared_ptr<std::byte[]>(p, [](std::byte* q) { ::operator delete[](q, std::align_val_t{kAlign}); });
  }
  for (int s : order) {
    Binding& b = bindings_[s];
    b.view.dtype = slots_[s].type.dtype;
    b.view.dims = *concrete(slots_[s].type);
    b.view.data = (device_mode_ ? device_arena_.get() : arena_.get()) + slots_[s].arena_offset;
  }
  // Dynamic buffers are released after their last reader.
  release_after_.assign(steps_.size(), {});
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    if (slot.arena_offset < 0 && !slot.is_constant && !slot.is_input && !slot.is_output &&
        slot.def_step >= 0) {
      int last = std::max(slot.last_use, slot.def_step);
      if (last >= 0 && last < static_cast<int>(steps_.size())) release_after_[last].push_back(static_cast<int>(s));
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
        saved.emplace_back(s, bindings_[s].view);
        bindings_[s].view.dtype = slots_[s].type.dtype;
        bindings_[s].view.dims = *concrete(slots_[s].type);
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
              host_views_[s] = bindings_[s].view;
              host_views_[s].data = nullptr;
            }
        StepContext ctx(*this, step, threads);
        step.kernel->prepare(ctx);
      }
    } catch (const Error& e) {
      fail(e.what());
    }
    for (auto& [s, v] : saved) bindings_[s].view = v;
  }
  for (const Step& step : steps_) {
    if (!device_mode_) break;
    ++(step.on_host ? stats_.staged_nodes : stats_.device_nodes);
  }
}

void Plan::stage_inputs(Step& step, std::vector<std::pair<int, ops::TensorView>>& swapped) {
  auto stage = [&](int s) {
    const ops::TensorView& v = bindings_[s].view;
    if (slots_[s].is_constant || v.dtype == DataType::kString) {
      if (!slots_[s].is_constant) host_views_[s] = v;  // strings live on the host
      return;
    }
    Tensor& t = staged_[static_cast<size_t>(s)];
    if (t.dtype() != v.dtype || t.dims() != v.dims) t = Tensor(v.dtype, v.dims);
    if (t.nbytes()) device_->to_host(t.mutable_data(), v.data, t.nbytes());
    host_views_[s] = view_of(t);
  };
  if (staged_.size() < slots_.size()) staged_.resize(slots_.size());
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
      swapped.emplace_back(s, bindings_[s].view);
      bindings_[s].view = host_views_[s];
    }
  }
}

void Plan::upload_outputs(Step& step) {
  for (int s : step.out) {
    if (s < 0) continue;
    Slot& slot = slots_[s];
    Binding& b = bindings_[s];
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
    if (s >= 0 && s < static_cast<int>(staged_.size())) staged_[static_cast<size_t>(s)] = Tensor();
}

// ---------------------------------------------------------------- execution

void Plan::execute(Step& step, int index, bool at_plan_time) {
  int threads = session_.opts_.threads;
  if (step.dynamic && !at_plan_time) {
    // Re-infer with the actual dims so output(i) knows its shape where inference can tell.
    ops::InferenceContext ictx{*step.node, model_.opset_version(step.node->domain).value_or(1),
                               {}, {}, {}, {}};
    ictx.default_opset = default_opset_;
    std::vector<ValueType> types;
    types.reserve(step.in.size());
    for (int s : step.in) {
      if (s < 0) {
        ictx.input_types.push_back(nullptr);
        ictx.input_values.push_back(nullptr);
        continue;
      }
      const ops::TensorView& v = bindings_[s].view;
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
    StepContext prep(*this, step, threads);
    step.kernel->prepare(prep);
  }
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
    for (auto& [s, v] : swapped) bindings_[s].view = v;
    throw;
  }
  for (auto& [s, v] : swapped) bindings_[s].view = v;
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
    Pending p{std::move(deferred_), {}, step.node->name.empty() ? step.node->op_type : step.node->name};
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
    const Binding& b = bindings_[s];
    OT_CHECK(b.view.data || b.view.strings || b.view.numel() == 0 || slots_[s].arena_offset >= 0,
             step.node->describe(), ": kernel did not produce output ", i);
  }
  if (index >= 0)
    for (int s : release_after_[index]) bindings_[s] = Binding{};
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
    session_.trace_.push_back({p.name + " (wait)", "Wait", t0 - session_.trace_origin_us_,
                               now_us() - t0});
  }
}

void Plan::complete_all() {
  for (size_t k = 0; k < pending_.size(); ++k) complete(static_cast<int>(k));
  pending_.clear();
}

std::vector<Tensor> Plan::run(const std::map<std::string, const Tensor*>& inputs,
                              const ResidentMap& resident) {
  if (device_mode_) device_->activate();
  for (const auto& [s, ps] : captures_) bindings_[s].view = parent_->bindings_[ps].view;
  if (input_buffers_.size() < slots_.size()) {
    input_buffers_.resize(slots_.size());
    input_buffer_bytes_.resize(slots_.size(), 0);
  }
  for (const auto& [name, t] : inputs) {
    const graph::Value* v = graph_.find_value(name);
    auto it = slot_index_.find(v);
    if (it == slot_index_.end()) continue;  // an input nothing reads
    const int s = it->second;
    bindings_[s].view = view_of(*t);
    if (!device_mode_ || t->dtype() == DataType::kString) continue;
    // A caller's tensor is copied to the device (into a buffer kept for the next run).
    if (input_buffer_bytes_[s] != t->nbytes() || !input_buffers_[s]) {
      input_buffers_[s] = device_->make_buffer(t->nbytes());
      input_buffer_bytes_[s] = t->nbytes();
    }
    device_->to_device(input_buffers_[s].get(), t->data(), t->nbytes());
    bindings_[s].view.data = input_buffers_[s].get();
  }
  for (const auto& [name, t] : resident) {
    auto it = slot_index_.find(graph_.find_value(name));
    if (it == slot_index_.end()) continue;
    ops::TensorView& view = bindings_[it->second].view;
    view.dtype = t->dtype;
    view.dims = t->dims;
    view.data = t->data.get();
    view.strings = nullptr;
  }
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
  std::vector<Tensor> out;
  for (const graph::Value* v : graph_.outputs()) {
    const int si = slot_index_.at(v);
    const Slot& slot = slots_[si];
    const ops::TensorView& view = bindings_[si].view;
    if (slot.alias_input >= 0) {
      // The new value goes into the aliased input's buffer (if the kernel did not write it).
      const ops::TensorView& target = bindings_[slot.alias_input].view;
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
  // Surfaces a device kernel's asynchronous failure in this run, and finishes the in-place state
  // updates before the caller reads the state.
  if (device_mode_) device_->synchronize();
  return out;
}

}  // namespace onnxtrain::runtime
