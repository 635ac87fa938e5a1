// InferenceSession: validates the model once, caches a Plan per input-shape signature.
#include "runtime/session.h"

#include <omp.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "graph/error.h"
#include "graph/file_io.h"
#include "graph/printer.h"
#include "ops/op_api.h"
#include "ops/sequence/static_sequences.h"
#include "runtime/plan.h"

namespace onnxtrain::runtime {
namespace {

// Ops of `g` (and its subgraphs) without a CPU kernel. Sequence nodes in `lowered` are left out
// (passes::lower_sequences rewrites them before a session sees the graph).
void collect_unsupported(const graph::Model& m, const graph::Graph& g,
                         const std::set<const graph::Node*>& lowered, std::set<std::string>& out) {
  for (const auto& n : g.nodes()) {
    int64_t opset = m.opset_version(n->domain).value_or(1);
    const ops::OpSchema* s = ops::OpRegistry::global().find(n->domain, n->op_type, opset);
    if ((!s || !s->cpu_kernel) && !lowered.count(n.get()))
      out.insert((n->domain.empty() ? "" : n->domain + ".") + n->op_type);
    for (const auto& a : n->attributes) {
      if (a.type == graph::AttrType::kGraph) collect_unsupported(m, a.g(), lowered, out);
      if (a.type == graph::AttrType::kGraphs)
        for (const auto& sg : a.graphs()) collect_unsupported(m, *sg, lowered, out);
    }
  }
}

// Sequence nodes of `g` and its subgraphs that lower_sequences can rewrite (`lowerable`), and a
// line naming each one it cannot (`stays`). Dims the declared types do not tell count as known:
// the pass infers shapes first and names the node itself if one stays unknown.
void check_sequences(const graph::Graph& g, std::set<const graph::Node*>& lowerable,
                     std::vector<std::string>& stays) {
  bool any = false;
  for (const auto& n : g.nodes()) any = any || ops::is_sequence_op(*n);
  if (any) {
    const ops::StaticSequences seqs = ops::analyze_sequences(g, ops::literal_constant, true);
    for (const auto& n : g.nodes())
      if (ops::is_sequence_op(*n) && !seqs.unlowerable.count(n.get())) lowerable.insert(n.get());
    for (const graph::Node* n : seqs.stay_order) stays.push_back(seqs.unlowerable.at(n));
  }
  for (const auto& n : g.nodes())
    for (const auto& a : n->attributes) {
      if (a.type == graph::AttrType::kGraph) check_sequences(a.g(), lowerable, stays);
      if (a.type == graph::AttrType::kGraphs)
        for (const auto& sg : a.graphs()) check_sequences(*sg, lowerable, stays);
    }
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const std::string& s : items) out += cat(out.empty() ? "" : sep, s);
  return out;
}

std::string describe_input(const graph::Value& v) {
  return cat("'", v.name(), "' ", graph::format_type(v.type));
}

// Checks a caller's tensor against the declared input type.
void check_input(const graph::Value& v, const graph::Tensor& t, const std::string& file) {
  const graph::ValueType& ty = v.type;
  if (ty.kind != graph::ValueType::Kind::kTensor) return;
  OT_CHECK(ty.dtype == graph::DataType::kUndefined || ty.dtype == t.dtype(), file, ": input '",
           v.name(), "' must be ", graph::dtype_short_name(ty.dtype), ", got ",
           graph::dtype_short_name(t.dtype()));
  if (!ty.shape) return;
  std::vector<int64_t> dims = t.dims();
  OT_CHECK(ty.shape->size() == dims.size(), file, ": input '", v.name(), "' must have shape ",
           graph::format_shape(ty.shape), ", got ", graph::format_shape(graph::make_shape(dims)));
  for (size_t i = 0; i < dims.size(); ++i) {
    const graph::Dim& d = (*ty.shape)[i];
    OT_CHECK(!d.is_known() || d.value == dims[i], file, ": input '", v.name(), "' must have shape ",
             graph::format_shape(ty.shape), ", got ", graph::format_shape(graph::make_shape(dims)));
  }
}

}  // namespace

std::vector<std::string> unsupported_ops(const graph::Model& m) {
  std::set<std::string> out;
  collect_unsupported(m, *m.graph, {}, out);
  return {out.begin(), out.end()};
}

void require_supported_ops(const graph::Model& m, const std::string& path) {
  std::set<const graph::Node*> lowerable;
  std::vector<std::string> stays;
  check_sequences(*m.graph, lowerable, stays);
  std::set<std::string> unsupported;
  collect_unsupported(m, *m.graph, lowerable, unsupported);
  if (unsupported.empty()) return;
  std::vector<std::string> missing(unsupported.begin(), unsupported.end());
  bool custom = false;
  for (const std::string& op : missing) {
    const auto dot = op.rfind('.');
    const std::string domain = dot == std::string::npos ? "" : op.substr(0, dot);
    custom = custom || (domain != "" && domain != "ai.onnx" && domain != ops::kOnnxtrainDomain &&
                        domain != "ai.onnx.ml" && domain != ops::kPreviewTrainingDomain);
  }
  fail(path, ": unsupported ops (no CPU kernel): ", join(missing, ", "),
       stays.empty() ? ""
                     : cat("; sequence ops that cannot be lowered to tensor ops: ",
                           ops::describe_unlowered(stays)),
       custom ? " (ops of a custom domain: load the library that defines them with "
                "--custom-op-lib PATH)"
              : "");
}

InferenceSession::InferenceSession(std::unique_ptr<graph::Model> model, SessionOptions opts)
    : model_(std::move(model)), opts_(std::move(opts)) {
  if (opts_.threads <= 0) opts_.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (!opts_.device) opts_.device = cpu_device();
  auto missing = unsupported_ops(*model_);
  if (!missing.empty()) {
    // Sequence ops never run: say which ones passes::lower_sequences would rewrite first.
    std::set<const graph::Node*> lowerable;
    std::vector<std::string> stays;
    check_sequences(*model_->graph, lowerable, stays);
    fail(model_->source_path.empty() ? "model" : model_->source_path,
         ": unsupported ops (no CPU kernel): ", join(missing, ", "),
         stays.empty() ? ""
                       : cat("; sequence ops that cannot be lowered to tensor ops: ",
                             ops::describe_unlowered(stays)),
         lowerable.empty() ? "" : " (lower the model's sequences first: passes::lower_sequences)");
  }
}

InferenceSession::~InferenceSession() {
  if (!opts_.profile_path.empty()) {
    try {
      write_profile(opts_.profile_path);
    } catch (const Error& e) {
      // Destructors must not throw: a profile that cannot be written is a warning, and nothing
      // else (the trained model, the checkpoints) depends on it.
      std::fprintf(stderr, "warning: profile not written: %s\n", e.what());
    }
  }
}

std::unique_ptr<InferenceSession> InferenceSession::load(const std::string& path, SessionOptions opts) {
  graph::LoadOptions lo;
  lo.max_tensor_bytes = opts.max_tensor_bytes;
  return std::make_unique<InferenceSession>(graph::import_onnx_file(path, lo), std::move(opts));
}

std::vector<graph::Tensor> InferenceSession::run(const std::map<std::string, graph::Tensor>& inputs) {
  std::map<std::string, const graph::Tensor*> bound;
  ResidentMap resident;
  Plan& plan = plan_for(inputs, bound, resident);
  return plan.run(bound, resident);
}

void InferenceSession::prepare(const std::map<std::string, graph::Tensor>& inputs) {
  std::map<std::string, const graph::Tensor*> bound;
  ResidentMap resident;
  plan_for(inputs, bound, resident);
}

Plan& InferenceSession::plan_for(const std::map<std::string, graph::Tensor>& inputs,
                                 std::map<std::string, const graph::Tensor*>& bound,
                                 ResidentMap& resident) {
  const std::string file = model_->source_path.empty() ? "model" : model_->source_path;
  std::string missing;
  for (const graph::Value* v : model_->graph->inputs()) {
    auto it = inputs.find(v->name());
    if (it == inputs.end()) {
      if (!v->has_initializer() && !resident_.count(v->name())) missing += (missing.empty() ? "" : ", ") + describe_input(*v);
      continue;
    }
    check_input(*v, it->second, file);
    bound[v->name()] = &it->second;
  }
  OT_CHECK(missing.empty(), file, ": missing inputs: ", missing);
  for (const auto& [name, t] : inputs) {
    const graph::Value* v = model_->graph->find_value(name);
    OT_CHECK(v && v->is_graph_input(), file, ": '", name, "' is not an input of the model");
    OT_CHECK(!resident_.count(name), file, ": input '", name,
             "' is resident on the device (set_resident); do not pass it to run()");
  }
  for (const auto& [name, t] : resident_) resident[name] = &t;
  std::string signature;
  for (const auto& [name, t] : bound) {
    signature += name + ":" + std::string(graph::dtype_short_name(t->dtype()));
    for (int64_t d : t->dims()) signature += "," + std::to_string(d);
    signature += ";";
  }
  for (const auto& [name, t] : resident_) {
    signature += "@" + name + ":" + std::string(graph::dtype_short_name(t.dtype));
    for (int64_t d : t.dims) signature += "," + std::to_string(d);
    signature += ";";
  }
  auto it = plans_.find(signature);
  if (it == plans_.end())
    it = plans_.emplace(signature, std::make_unique<Plan>(*this, bound, resident)).first;
  last_plan_ = it->second.get();
  return *last_plan_;
}

void InferenceSession::set_resident(const std::string& name, const graph::Tensor& value) {
  const std::string file = model_->source_path.empty() ? "model" : model_->source_path;
  const graph::Value* v = model_->graph->find_value(name);
  OT_CHECK(v && v->is_graph_input(), file, ": resident '", name, "' is not an input of the model");
  OT_CHECK(value.dtype() != graph::DataType::kString, file, ": resident '", name,
           "' cannot be a string tensor");
  check_input(*v, value, file);
  opts_.device->activate();
  auto it = resident_.find(name);
  if (it == resident_.end()) {
    // Allocated before it is recorded: a failed allocation leaves no entry without a buffer.
    DeviceTensor fresh{value.dtype(), value.dims(), value.nbytes(),
                       opts_.device->make_buffer(value.nbytes())};
    it = resident_.emplace(name, std::move(fresh)).first;
  }
  DeviceTensor& t = it->second;
  if (t.dtype != value.dtype() || t.dims != value.dims())
    fail(file, ": resident '", name, "' is ", graph::dtype_short_name(t.dtype),
         graph::format_shape(graph::make_shape(t.dims)), ", new value ",
         graph::dtype_short_name(value.dtype()),
         graph::format_shape(graph::make_shape(value.dims())));
  opts_.device->to_device(t.data.get(), value.data(), t.nbytes);
  opts_.device->synchronize();
}

graph::Tensor InferenceSession::get_resident(const std::string& name) const {
  auto it = resident_.find(name);
  OT_CHECK(it != resident_.end(), "'", name, "' is not a resident input");
  const DeviceTensor& t = it->second;
  graph::Tensor out(t.dtype, t.dims);
  opts_.device->activate();
  if (t.nbytes) opts_.device->to_host(out.mutable_data(), t.data.get(), t.nbytes);
  return out;
}

int64_t InferenceSession::shared_host_bytes() const {
  return static_cast<int64_t>((host_arena_ ? host_arena_->bytes : 0) +
                              (host_workspace_ ? host_workspace_->bytes : 0));
}

const PlanStats& InferenceSession::last_plan_stats() const {
  static const PlanStats kEmpty;
  return last_plan_ ? last_plan_->stats() : kEmpty;
}

void InferenceSession::write_profile(const std::string& path) const {
  std::ostringstream out;
  out << "{\"traceEvents\":[\n";
  for (size_t i = 0; i < trace_.size(); ++i) {
    const auto& e = trace_[i];
    std::string name;
    for (char c : e.name) {
      if (c == '"' || c == '\\') name += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) name += c;
    }
    out << (i ? ",\n" : "") << "{\"name\":\"" << name << "\",\"cat\":\"" << e.op
        << "\",\"ph\":\"X\",\"ts\":" << e.start_us << ",\"dur\":" << e.dur_us
        << ",\"pid\":0,\"tid\":0}";
  }
  out << "\n],\"displayTimeUnit\":\"ms\"}\n";
  graph::write_file(path, out.str());
}

}  // namespace onnxtrain::runtime
