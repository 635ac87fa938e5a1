// The training signature (training_signature.h): lookups, the "onnxtrain.training" metadata
// text, and its check against the graph.
//
// Text: one record per line, fields separated by tabs, each field `key=value` (split at the
// first '=': keys have none, names may). Records:
//   signature  version=1  replicas=R  [partition=k]
//   input      role=batch|labels|targets|lr|loss_scale|state|grad_unscale  name=N
//   labels     ignore_index=i                   (TrainingSignature::ignore_index)
//   loss       model_output=N                   (TrainingSignature::model_loss)
//   result     role=loss|correct|grads_finite  name=N  [replica=k]
//   state      kind=parameter|optimizer_state|running_statistic|step_counter|weight_copy  state=S
//              updated=U  original=O  [replica=k]
//   gradient   param=P  grad=G  [reduced=A]  [replica=k]  [bucket=b]
//   bucket     index=b  node=N  bytes=B
//   precision  compute=bf16|f16                 (TrainingSignature::compute_dtype; absent = f32)
//   copy       master=P  copy=C  [replica=k]    (mixed precision's low-precision weight copies)
//   node       name=N  replica=k            (Node::replica of a replicated node)
#include "graph/training_signature.h"

#include <charconv>
#include <functional>
#include <map>
#include <sstream>
#include <unordered_map>

#include "graph/error.h"
#include "graph/ir.h"
#include "graph/printer.h"

namespace onnxtrain::graph {
namespace {

template <typename E, size_t N>
std::string_view enum_name(E e, const std::string_view (&names)[N]) {
  const auto i = static_cast<size_t>(e);
  return i < N ? names[i] : "?";
}

constexpr std::string_view kStateKinds[] = {"parameter", "optimizer_state", "running_statistic",
                                            "step_counter", "weight_copy"};
constexpr std::string_view kInputRoles[] = {"batch", "labels", "targets", "lr", "loss_scale",
                                            "state", "grad_unscale"};
constexpr std::string_view kResultRoles[] = {"loss", "correct", "grads_finite"};

template <typename E, size_t N>
bool parse_enum(std::string_view s, const std::string_view (&names)[N], E& out) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) {
      out = static_cast<E>(i);
      return true;
    }
  return false;
}

// A line under construction: `record\tkey=value\t...`.
class Line {
 public:
  explicit Line(std::string_view record) : text_(record) {}
  Line& field(std::string_view key, const std::string& value) {
    OT_CHECK(value.find_first_of("\t\n") == std::string::npos, "export: training signature ",
             text_.substr(0, text_.find('\t')), " ", key, " '", value,
             "': a tab or newline cannot be written to the '", kTrainingKey, "' lines");
    text_ += cat("\t", key, "=", value);
    return *this;
  }
  Line& field(std::string_view key, int64_t value) { return field(key, std::to_string(value)); }
  Line& optional(std::string_view key, int64_t value) {
    return value >= 0 ? field(key, value) : *this;
  }
  Line& optional(std::string_view key, const std::string& value) {
    return value.empty() ? *this : field(key, value);
  }
  std::string str() const { return text_ + "\n"; }

 private:
  std::string text_;
};

void for_each_node(const Graph& g, const std::function<void(Node&)>& fn) {
  for (const auto& n : g.nodes()) {
    fn(*n);
    for (const Attribute& a : n->attributes) {
      if (a.type == AttrType::kGraph) for_each_node(a.g(), fn);
      if (a.type == AttrType::kGraphs)
        for (const GraphPtr& sub : a.graphs()) for_each_node(*sub, fn);
    }
  }
}

// One decoded line: its fields by key, each read at most once; leftovers are errors.
class Fields {
 public:
  Fields(std::string at, std::map<std::string, std::string> f) : at_(std::move(at)), f_(std::move(f)) {}
  std::string str(const std::string& key) {
    auto it = f_.find(key);
    OT_CHECK(it != f_.end(), at_, "missing field '", key, "'");
    std::string v = std::move(it->second);
    f_.erase(it);
    return v;
  }
  std::string str_or(const std::string& key, const std::string& fallback) {
    return f_.count(key) ? str(key) : fallback;
  }
  int64_t num(const std::string& key) {
    const std::string s = str(key);
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    OT_CHECK(ec == std::errc() && p == s.data() + s.size(), at_, "field '", key,
             "' is not an integer: '", s, "'");
    return v;
  }
  int index(const std::string& key, int fallback = -1) {
    if (!f_.count(key)) return fallback;
    const int64_t v = num(key);
    OT_CHECK(v >= -1 && v < (int64_t{1} << 30), at_, "field '", key, "' out of range: ", v);
    return static_cast<int>(v);
  }
  template <typename E, size_t N>
  E enumerated(const std::string& key, const std::string_view (&names)[N]) {
    const std::string s = str(key);
    E e{};
    OT_CHECK(parse_enum(s, names, e), at_, "field '", key, "' has unknown value '", s, "'");
    return e;
  }
  void done() const {
    OT_CHECK(f_.empty(), at_, "unknown field '", f_.begin()->first, "'");
  }
  const std::string& at() const { return at_; }

 private:
  std::string at_;
  std::map<std::string, std::string> f_;
};

}  // namespace

std::string_view state_kind_name(StateKind k) { return enum_name(k, kStateKinds); }
std::string_view input_role_name(InputRole r) { return enum_name(r, kInputRoles); }
std::string_view result_role_name(ResultRole r) { return enum_name(r, kResultRoles); }

const StateBinding* TrainingSignature::find_state(std::string_view name) const {
  for (const StateBinding& s : state)
    if (s.state == name) return &s;
  return nullptr;
}

const InputBinding* TrainingSignature::find_input(InputRole role) const {
  for (const InputBinding& i : inputs)
    if (i.role == role) return &i;
  return nullptr;
}

bool TrainingSignature::is_input(std::string_view name, InputRole role) const {
  for (const InputBinding& i : inputs)
    if (i.role == role && i.name == name) return true;
  return false;
}

std::vector<const InputBinding*> TrainingSignature::inputs_with(InputRole role) const {
  std::vector<const InputBinding*> out;
  for (const InputBinding& i : inputs)
    if (i.role == role) out.push_back(&i);
  return out;
}

std::vector<const ResultBinding*> TrainingSignature::results_with(ResultRole role) const {
  std::vector<const ResultBinding*> out;
  for (const ResultBinding& r : results)
    if (r.role == role) out.push_back(&r);
  return out;
}

const GradientBinding* TrainingSignature::gradient_of(std::string_view param) const {
  for (const GradientBinding& g : gradients)
    if (g.param == param) return &g;
  return nullptr;
}

std::string encode_training(const Model& m) {
  const TrainingSignature& t = m.training;
  if (t.empty()) return "";
  std::string text = Line("signature")
                         .field("version", kTrainingSignatureVersion)
                         .field("replicas", t.replicas)
                         .optional("partition", t.partition)
                         .str();
  for (const InputBinding& i : t.inputs)
    text += Line("input").field("role", std::string(input_role_name(i.role))).field("name", i.name).str();
  if (t.ignore_index) text += Line("labels").field("ignore_index", *t.ignore_index).str();
  if (!t.model_loss.empty()) text += Line("loss").field("model_output", t.model_loss).str();
  if (t.compute_dtype != DataType::kFloat)
    text += Line("precision").field("compute", std::string(dtype_short_name(t.compute_dtype))).str();
  for (const LowPrecisionCopy& c : t.copies)
    text += Line("copy")
                .field("master", c.master)
                .field("copy", c.copy)
                .optional("replica", c.replica)
                .str();
  for (const ResultBinding& r : t.results)
    text += Line("result")
                .field("role", std::string(result_role_name(r.role)))
                .field("name", r.name)
                .optional("replica", r.replica)
                .str();
  for (const StateBinding& s : t.state)
    text += Line("state")
                .field("kind", std::string(state_kind_name(s.kind)))
                .field("state", s.state)
                .field("updated", s.updated)
                .field("original", s.original)
                .optional("replica", s.replica)
                .str();
  for (const GradientBinding& g : t.gradients)
    text += Line("gradient")
                .field("param", g.param)
                .field("grad", g.grad)
                .optional("reduced", g.reduced)
                .optional("replica", g.replica)
                .optional("bucket", g.bucket)
                .str();
  for (size_t b = 0; b < t.buckets.size(); ++b)
    text += Line("bucket")
                .field("index", static_cast<int64_t>(b))
                .field("node", t.buckets[b].node)
                .field("bytes", t.buckets[b].bytes)
                .str();
  if (m.graph)
    for_each_node(*m.graph, [&](Node& n) {
      if (n.replica < 0) return;
      OT_CHECK(!n.name.empty(), "export: ", n.describe(), " belongs to replica ", n.replica,
               " but has no name; the training signature keys nodes by name");
      text += Line("node").field("name", n.name).field("replica", n.replica).str();
    });
  return text;
}

void decode_training(const std::string& text, Model& m, const std::string& where) {
  TrainingSignature t;
  std::unordered_map<std::string, Node*> by_name;
  if (m.graph)
    for_each_node(*m.graph, [&](Node& n) {
      if (n.name.empty()) return;
      auto [it, fresh] = by_name.emplace(n.name, &n);
      if (!fresh) it->second = nullptr;
    });
  std::istringstream in(text);
  std::string line;
  bool header = false;
  for (int no = 1; std::getline(in, line); ++no) {
    if (line.empty()) continue;
    const std::string at = cat(where, ": metadata_props '", kTrainingKey, "' line ", no, ": ");
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      const size_t tab = line.find('\t', start);
      parts.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    std::map<std::string, std::string> kv;
    for (size_t i = 1; i < parts.size(); ++i) {
      const size_t eq = parts[i].find('=');
      OT_CHECK(eq != std::string::npos && eq > 0, at, "expected 'key=value', got '", parts[i], "'");
      OT_CHECK(kv.emplace(parts[i].substr(0, eq), parts[i].substr(eq + 1)).second, at, "field '",
               parts[i].substr(0, eq), "' is given twice");
    }
    Fields f(at, std::move(kv));
    const std::string& record = parts[0];
    OT_CHECK(header || record == "signature", at, "the first line must be the 'signature' record");
    if (record == "signature") {
      OT_CHECK(!header, at, "a second 'signature' record");
      header = true;
      const int64_t version = f.num("version");
      OT_CHECK(version == kTrainingSignatureVersion, at, "version ", version,
               " is not supported (this build reads version ", kTrainingSignatureVersion, ")");
      t.replicas = f.index("replicas", 1);
      OT_CHECK(t.replicas >= 1, at, "field 'replicas' must be >= 1, got ", t.replicas);
      t.partition = f.index("partition");
    } else if (record == "input") {
      InputBinding b;
      b.role = f.enumerated<InputRole>("role", kInputRoles);
      b.name = f.str("name");
      t.inputs.push_back(std::move(b));
    } else if (record == "labels") {
      OT_CHECK(!t.ignore_index, at, "a second 'labels' record");
      t.ignore_index = f.num("ignore_index");
    } else if (record == "loss") {
      OT_CHECK(t.model_loss.empty(), at, "a second 'loss' record");
      t.model_loss = f.str("model_output");
    } else if (record == "precision") {
      OT_CHECK(t.compute_dtype == DataType::kFloat, at, "a second 'precision' record");
      const std::string name = f.str("compute");
      const std::optional<DataType> d = dtype_from_short_name(name);
      OT_CHECK(d && (*d == DataType::kBFloat16 || *d == DataType::kFloat16), at,
               "field 'compute' must be bf16 or f16, got '", name, "'");
      t.compute_dtype = *d;
    } else if (record == "copy") {
      LowPrecisionCopy c;
      c.master = f.str("master");
      c.copy = f.str("copy");
      c.replica = f.index("replica");
      t.copies.push_back(std::move(c));
    } else if (record == "result") {
      ResultBinding b;
      b.role = f.enumerated<ResultRole>("role", kResultRoles);
      b.name = f.str("name");
      b.replica = f.index("replica");
      t.results.push_back(std::move(b));
    } else if (record == "state") {
      StateBinding b;
      b.kind = f.enumerated<StateKind>("kind", kStateKinds);
      b.state = f.str("state");
      b.updated = f.str("updated");
      b.original = f.str("original");
      b.replica = f.index("replica");
      t.state.push_back(std::move(b));
    } else if (record == "gradient") {
      GradientBinding b;
      b.param = f.str("param");
      b.grad = f.str("grad");
      b.reduced = f.str_or("reduced", "");
      b.replica = f.index("replica");
      b.bucket = f.index("bucket");
      t.gradients.push_back(std::move(b));
    } else if (record == "bucket") {
      const int64_t index = f.num("index");
      OT_CHECK(index == static_cast<int64_t>(t.buckets.size()), at, "bucket index ", index,
               ", expected ", t.buckets.size(), " (buckets are listed in order)");
      GradientBucket b;
      b.node = f.str("node");
      b.bytes = f.num("bytes");
      t.buckets.push_back(std::move(b));
    } else if (record == "node") {
      const std::string name = f.str("name");
      const int replica = f.index("replica");
      auto it = by_name.find(name);
      OT_CHECK(it != by_name.end(), at, "no node is named '", name, "'");
      OT_CHECK(it->second, at, "several nodes are named '", name, "'");
      it->second->replica = replica;
    } else {
      fail(at, "unknown record '", record, "'");
    }
    f.done();
  }
  m.training = std::move(t);
}

void verify_training(const Model& m, const std::string& context) {
  const TrainingSignature& t = m.training;
  if (t.empty() || !m.graph) return;
  const Graph& g = *m.graph;
  const std::string at = cat(context, ": training signature: ");
  auto value = [&](const std::string& record, const char* field, const std::string& name) {
    const Value* v = g.find_value(name);
    OT_CHECK(v, at, record, " ", field, " '", name, "': no such value in the main graph");
    return v;
  };
  auto replica_ok = [&](const std::string& record, int r) {
    OT_CHECK(r >= -1 && r < t.replicas, at, record, " replica ", r, " is not below replicas = ",
             t.replicas);
    OT_CHECK(t.partition < 0 || r < 0 || r == t.partition, at, record, " belongs to replica ", r,
             " in the partition of replica ", t.partition);
  };
  OT_CHECK(t.replicas >= 1, at, "replicas must be >= 1, got ", t.replicas);
  OT_CHECK(t.partition < t.replicas, at, "partition ", t.partition, " is not below replicas = ",
           t.replicas);
  for (const InputBinding& i : t.inputs) {
    const std::string rec = cat("input (", input_role_name(i.role), ")");
    const Value* v = value(rec, "name", i.name);
    OT_CHECK(v->is_graph_input(), at, rec, " name '", i.name, "' is not a graph input");
  }
  for (const ResultBinding& r : t.results) {
    const std::string rec = cat("result (", result_role_name(r.role), ")");
    const Value* v = value(rec, "name", r.name);
    OT_CHECK(v->is_graph_output(), at, rec, " name '", r.name, "' is not a graph output");
    replica_ok(rec, r.replica);
    if (r.role == ResultRole::kGradsFinite) {
      OT_CHECK(!v->type.is_tensor() || v->type.dtype == DataType::kBool, at, rec, " '", r.name,
               "' is ", dtype_short_name(v->type.dtype), ", not bool");
      OT_CHECK(t.find_input(InputRole::kGradUnscale), at, rec, " '", r.name,
               "' without a grad_unscale input (dynamic loss scaling has both)");
    }
  }
  std::unordered_map<std::string, const StateBinding*> states;
  for (const StateBinding& s : t.state) {
    const std::string rec = cat("state (", state_kind_name(s.kind), ")");
    const Value* v = value(rec, "state", s.state);
    OT_CHECK(v->has_initializer() || v->is_graph_input(), at, rec, " state '", s.state,
             "' is neither an initializer nor a graph input");
    const Value* u = value(rec, "updated", s.updated);
    OT_CHECK(u->is_graph_output(), at, rec, " updated '", s.updated, "' is not a graph output");
    OT_CHECK(!s.original.empty(), at, rec, " '", s.state, "' has an empty original name");
    OT_CHECK(states.emplace(s.state, &s).second, at, rec, " state '", s.state, "' is listed twice");
    replica_ok(rec, s.replica);
    const ValueType st = v->has_initializer()
                             ? ValueType::tensor(v->initializer().dtype(), make_shape(v->initializer().dims()))
                             : v->type;
    if (st.is_tensor() && u->type.is_tensor()) {
      OT_CHECK(st.dtype == u->type.dtype, at, rec, " '", s.state, "' is ",
               dtype_short_name(st.dtype), " but updated '", s.updated, "' is ",
               dtype_short_name(u->type.dtype));
      if (st.shape && u->type.shape && st.shape->size() == u->type.shape->size())
        for (size_t d = 0; d < st.shape->size(); ++d) {
          const Dim& a = (*st.shape)[d];
          const Dim& b = (*u->type.shape)[d];
          OT_CHECK(!a.is_known() || !b.is_known() || a.value == b.value, at, rec, " '", s.state,
                   "' has shape ", format_shape(st.shape), " but updated '", s.updated,
                   "' has shape ", format_shape(u->type.shape));
        }
      else
        OT_CHECK(!st.shape || !u->type.shape, at, rec, " '", s.state, "' has shape ",
                 format_shape(st.shape), " but updated '", s.updated, "' has shape ",
                 format_shape(u->type.shape));
    }
  }
  for (const GradientBinding& gb : t.gradients) {
    // Before attach_optimizer the parameter is not yet state; once it is, it is a parameter.
    value("gradient", "param", gb.param);
    auto it = states.find(gb.param);
    OT_CHECK(it == states.end() || it->second->kind == StateKind::kParameter, at,
             "gradient param '", gb.param, "' is state of kind ",
             it == states.end() ? "" : state_kind_name(it->second->kind), ", not a parameter");
    value("gradient", "grad", gb.grad);
    if (!gb.reduced.empty()) value("gradient", "reduced", gb.reduced);
    replica_ok("gradient", gb.replica);
    OT_CHECK(gb.bucket >= -1 && gb.bucket < static_cast<int>(t.buckets.size()), at,
             "gradient of '", gb.param, "' names bucket ", gb.bucket, " of ", t.buckets.size());
  }
  OT_CHECK(t.copies.empty() || t.compute_dtype != DataType::kFloat, at,
           "copy records without a 'precision' record");
  for (const LowPrecisionCopy& c : t.copies) {
    value("copy", "master", c.master);
    auto it = states.find(c.master);
    OT_CHECK(it == states.end() || it->second->kind == StateKind::kParameter, at, "copy master '",
             c.master, "' is state of kind ",
             it == states.end() ? "" : state_kind_name(it->second->kind), ", not a parameter");
    const Value* v = value("copy", "copy", c.copy);
    OT_CHECK(v->dtype() == DataType::kUndefined || v->dtype() == t.compute_dtype, at, "copy '",
             c.copy, "' is ", dtype_short_name(v->dtype()), ", the compute dtype is ",
             dtype_short_name(t.compute_dtype));
    replica_ok("copy", c.replica);
  }
  for (const StateBinding& s : t.state) {
    if (s.kind != StateKind::kWeightCopy) continue;
    bool named = false;
    for (const LowPrecisionCopy& c : t.copies) named = named || c.copy == s.state;
    OT_CHECK(named, at, "state (weight_copy) '", s.state, "' is the copy of no copy record");
  }
  for (const GradientBucket& b : t.buckets) {
    const Node* found = nullptr;
    for (const auto& n : g.nodes())
      if (n->name == b.node) found = n.get();
    OT_CHECK(found && found->op_type == "AllReduce", at, "bucket node '", b.node,
             "': no AllReduce node has this name");
  }
}

}  // namespace onnxtrain::graph
