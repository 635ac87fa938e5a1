// Graph IR: ownership, edges and the mutation API passes use (ordering and cloning: ir_order.cc).
#include "graph/ir.h"

#include <algorithm>
#include <unordered_set>

#include "graph/error.h"

namespace onnxtrain::graph {

bool ValueType::operator==(const ValueType& o) const {
  if (kind != o.kind || dtype != o.dtype || shape != o.shape || map_key != o.map_key) return false;
  if (!elem || !o.elem) return !elem && !o.elem;
  return *elem == *o.elem;
}

Shape make_shape(std::initializer_list<int64_t> dims) {
  return make_shape(std::span<const int64_t>(dims.begin(), dims.size()));
}

Shape make_shape(std::span<const int64_t> dims) {
  Shape s;
  for (int64_t d : dims) s.push_back(Dim::known(d));
  return s;
}

std::string_view attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::kFloat: return "float";
    case AttrType::kInt: return "int";
    case AttrType::kString: return "string";
    case AttrType::kTensor: return "tensor";
    case AttrType::kGraph: return "graph";
    case AttrType::kFloats: return "floats";
    case AttrType::kInts: return "ints";
    case AttrType::kStrings: return "strings";
    case AttrType::kTensors: return "tensors";
    case AttrType::kGraphs: return "graphs";
    case AttrType::kSparseTensor: return "sparse_tensor";
    case AttrType::kSparseTensors: return "sparse_tensors";
    case AttrType::kTypeProto: return "type_proto";
    case AttrType::kTypeProtos: return "type_protos";
    default: return "undefined";
  }
}

// ---------------------------------------------------------------- GraphPtr / Attribute

GraphPtr::GraphPtr(std::unique_ptr<Graph> g) : g_(std::move(g)) {}
GraphPtr::GraphPtr(const GraphPtr& o) : g_(o.g_ ? o.g_->clone(o.g_->parent()) : nullptr) {}
GraphPtr& GraphPtr::operator=(const GraphPtr& o) {
  if (this != &o) g_ = o.g_ ? o.g_->clone(o.g_->parent()) : nullptr;
  return *this;
}
GraphPtr::~GraphPtr() = default;

namespace {
template <typename T>
Attribute make_attr(std::string n, AttrType t, T v) {
  Attribute a;
  a.name = std::move(n);
  a.type = t;
  a.value = std::move(v);
  return a;
}
}  // namespace

Attribute Attribute::make_float(std::string n, float v) {
  return make_attr(std::move(n), AttrType::kFloat, v);
}
Attribute Attribute::make_int(std::string n, int64_t v) {
  return make_attr(std::move(n), AttrType::kInt, v);
}
Attribute Attribute::make_string(std::string n, std::string v) {
  return make_attr(std::move(n), AttrType::kString, std::move(v));
}
Attribute Attribute::make_tensor(std::string n, Tensor v) {
  return make_attr(std::move(n), AttrType::kTensor, std::move(v));
}
Attribute Attribute::make_graph(std::string n, std::unique_ptr<Graph> g) {
  return make_attr(std::move(n), AttrType::kGraph, GraphPtr(std::move(g)));
}
Attribute Attribute::make_floats(std::string n, std::vector<float> v) {
  return make_attr(std::move(n), AttrType::kFloats, std::move(v));
}
Attribute Attribute::make_ints(std::string n, std::vector<int64_t> v) {
  return make_attr(std::move(n), AttrType::kInts, std::move(v));
}
Attribute Attribute::make_strings(std::string n, std::vector<std::string> v) {
  return make_attr(std::move(n), AttrType::kStrings, std::move(v));
}

// ---------------------------------------------------------------- Value / Node

bool Value::is_graph_output() const {
  const auto& outs = owner_->outputs();
  return std::find(outs.begin(), outs.end(), this) != outs.end();
}

void Node::set_input(size_t i, Value* v) {
  if (i >= inputs_.size()) inputs_.resize(i + 1, nullptr);
  Value* old = inputs_[i];
  if (old) {
    auto& u = old->uses_;
    u.erase(std::find(u.begin(), u.end(), Use{this, static_cast<int>(i)}));
  }
  inputs_[i] = v;
  if (v) v->uses_.push_back(Use{this, static_cast<int>(i)});
}

const Attribute* Node::find_attr(std::string_view n) const {
  for (const auto& a : attributes)
    if (a.name == n) return &a;
  return nullptr;
}

Attribute* Node::find_attr(std::string_view n) {
  for (auto& a : attributes)
    if (a.name == n) return &a;
  return nullptr;
}

int64_t Node::attr_int(std::string_view n, int64_t fallback) const {
  const Attribute* a = find_attr(n);
  return a && a->type == AttrType::kInt ? a->i() : fallback;
}

float Node::attr_float(std::string_view n, float fallback) const {
  const Attribute* a = find_attr(n);
  return a && a->type == AttrType::kFloat ? a->f() : fallback;
}

std::string Node::attr_string(std::string_view n, const std::string& fallback) const {
  const Attribute* a = find_attr(n);
  return a && a->type == AttrType::kString ? a->s() : fallback;
}

std::vector<int64_t> Node::attr_ints(std::string_view n, std::vector<int64_t> fallback) const {
  const Attribute* a = find_attr(n);
  return a && a->type == AttrType::kInts ? a->ints() : fallback;
}

void Node::set_attr(Attribute a) {
  if (Attribute* existing = find_attr(a.name))
    *existing = std::move(a);
  else
    attributes.push_back(std::move(a));
}

std::string Node::describe() const {
  if (!name.empty()) return cat("node '", name, "' (", op_type, ")");
  if (owner_) {
    const auto& nodes = owner_->nodes();
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].get() == this) return cat("node #", i, " (", op_type, ")");
  }
  return cat("unnamed node (", op_type, ")");
}

// ---------------------------------------------------------------- Graph

Graph::Graph(std::string n, Graph* parent) : name(std::move(n)), parent_(parent) {}

Graph::~Graph() {
  // Subgraphs may hold uses of our values; drop them before our values die.
  for (auto& n : nodes_) n->attributes.clear();
  // Our nodes may read values of enclosing graphs that outlive us: detach those uses.
  for (auto& n : nodes_)
    for (size_t i = 0; i < n->inputs_.size(); ++i)
      if (n->inputs_[i] && n->inputs_[i]->owner_ != this) n->set_input(i, nullptr);
}

int Graph::depth() const {
  int d = 0;
  for (const Graph* g = parent_; g; g = g->parent_) ++d;
  return d;
}

Value* Graph::add_value(const std::string& n, ValueType type) {
  OT_CHECK(!n.empty(), "graph '", name, "': empty value name");
  OT_CHECK(!by_name_.count(n), "graph '", name, "': value '", n, "' is defined twice");
  auto v = std::make_unique<Value>();
  v->name_ = n;
  v->owner_ = this;
  v->type = std::move(type);
  Value* raw = v.get();
  values_.push_back(std::move(v));
  by_name_[n] = raw;
  return raw;
}

Value* Graph::find_value(std::string_view n) const {
  auto it = by_name_.find(std::string(n));
  return it == by_name_.end() ? nullptr : it->second;
}

Value* Graph::lookup(std::string_view n) const {
  for (const Graph* g = this; g; g = g->parent_)
    if (Value* v = g->find_value(n)) return v;
  return nullptr;
}

bool Graph::name_used_anywhere(const std::string& n) const {
  const Graph* root = this;
  while (root->parent_) root = root->parent_;
  // Walk the whole tree of graphs so a fresh name never shadows or is shadowed.
  std::vector<const Graph*> stack{root};
  while (!stack.empty()) {
    const Graph* g = stack.back();
    stack.pop_back();
    if (g->by_name_.count(n)) return true;
    for (const auto& node : g->nodes_)
      for (const auto& a : node->attributes) {
        if (a.type == AttrType::kGraph) stack.push_back(&a.g());
        if (a.type == AttrType::kGraphs)
          for (const auto& sg : a.graphs()) stack.push_back(sg.get());
      }
  }
  return false;
}

std::string Graph::fresh_name(const std::string& base) {
  if (!name_used_anywhere(base)) return base;
  int& k = fresh_counter_[base];
  for (;;) {
    std::string candidate = cat(base, "_", ++k);
    if (!name_used_anywhere(candidate)) return candidate;
  }
}

void Graph::rename_value(Value* v, const std::string& new_name) {
  if (v->name_ == new_name) return;
  OT_CHECK(!by_name_.count(new_name), "graph '", name, "': cannot rename '", v->name_, "' to '",
           new_name, "': name taken");
  by_name_.erase(v->name_);
  v->name_ = new_name;
  by_name_[new_name] = v;
}

Value* Graph::add_input(const std::string& n, ValueType type) {
  Value* v = add_value(n, std::move(type));
  mark_input(v);
  return v;
}

void Graph::mark_input(Value* v) {
  OT_CHECK(v->owner_ == this, "graph '", name, "': input '", v->name(), "' belongs to another graph");
  OT_CHECK(!v->is_input_, "graph '", name, "': '", v->name(), "' is already an input");
  OT_CHECK(!v->producer_, "graph '", name, "': '", v->name(), "' is produced by a node");
  v->is_input_ = true;
  inputs_.push_back(v);
}

Value* Graph::add_initializer(const std::string& n, Tensor t, bool also_input) {
  std::vector<int64_t> dims = t.dims();
  DataType dt = t.dtype();
  Value* v = add_value(n, ValueType::tensor(dt, make_shape(dims)));
  set_initializer(v, std::move(t));
  if (also_input) mark_input(v);
  return v;
}

void Graph::set_initializer(Value* v, Tensor t) {
  OT_CHECK(!v->producer_, "graph '", name, "': initializer '", v->name(), "' is produced by a node");
  if (!v->initializer_) initializer_order_.push_back(v);
  v->initializer_ = std::move(t);
}

void Graph::clear_initializer(Value* v) {
  if (!v->initializer_) return;
  v->initializer_.reset();
  initializer_order_.erase(std::find(initializer_order_.begin(), initializer_order_.end(), v));
}

void Graph::remove_input(Value* v) {
  auto it = std::find(inputs_.begin(), inputs_.end(), v);
  OT_CHECK(it != inputs_.end(), "graph '", name, "': '", v->name(), "' is not an input");
  inputs_.erase(it);
  v->is_input_ = false;
}

std::vector<Value*> Graph::initializers() const { return initializer_order_; }

Node* Graph::create_node(size_t position, const std::string& op_type,
                         const std::vector<Value*>& inputs,
                         const std::vector<std::string>& output_names, const std::string& n,
                         const std::string& domain) {
  auto node = std::make_unique<Node>();
  Node* raw = node.get();
  raw->op_type = op_type;
  raw->domain = domain;
  raw->name = n;
  raw->owner_ = this;
  // Create outputs first so a name clash leaves the graph untouched.
  std::vector<Value*> outs;
  try {
    for (const auto& on : output_names) outs.push_back(on.empty() ? nullptr : add_value(on));
  } catch (...) {
    for (Value* v : outs)
      if (v) remove_value(v);
    throw;
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i]) continue;
    outs[i]->producer_ = raw;
    outs[i]->producer_output_ = static_cast<int>(i);
  }
  raw->outputs_ = std::move(outs);
  for (Value* in : inputs) raw->add_input(in);
  nodes_.insert(nodes_.begin() + static_cast<std::ptrdiff_t>(position), std::move(node));
  return raw;
}

Node* Graph::add_node(const std::string& op_type, const std::vector<Value*>& inputs,
                      const std::vector<std::string>& output_names, const std::string& n,
                      const std::string& domain) {
  return create_node(nodes_.size(), op_type, inputs, output_names, n, domain);
}

Node* Graph::insert_node_before(Node* before, const std::string& op_type,
                                const std::vector<Value*>& inputs,
                                const std::vector<std::string>& output_names,
                                const std::string& n, const std::string& domain) {
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](auto& p) { return p.get() == before; });
  OT_CHECK(it != nodes_.end(), "graph '", name, "': insert position is not a node of this graph");
  return create_node(static_cast<size_t>(it - nodes_.begin()), op_type, inputs, output_names, n,
                     domain);
}

Value* Graph::add_node_output(Node* n, size_t i, const std::string& value_name) {
  OT_CHECK(n && n->owner_ == this, "graph '", name, "': add_node_output: not a node of this graph");
  OT_CHECK(i >= n->outputs_.size() || !n->outputs_[i], "graph '", name, "': ", n->describe(),
           " already has output ", i);
  Value* v = add_value(value_name);
  if (n->outputs_.size() <= i) n->outputs_.resize(i + 1, nullptr);
  n->outputs_[i] = v;
  v->producer_ = n;
  v->producer_output_ = static_cast<int>(i);
  return v;
}

void Graph::remove_node(Node* n) {
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](auto& p) { return p.get() == n; });
  OT_CHECK(it != nodes_.end(), "graph '", name, "': ", n->describe(), " is not in this graph");
  for (Value* out : n->outputs_) {
    if (!out) continue;
    OT_CHECK(out->uses_.empty() && !out->is_graph_output(), "graph '", name, "': cannot remove ",
             n->describe(), ": output '", out->name(), "' is still used");
  }
  for (size_t i = 0; i < n->inputs_.size(); ++i) n->set_input(i, nullptr);
  n->attributes.clear();  // releases uses held by subgraphs
  std::vector<Value*> outs = n->outputs_;
  nodes_.erase(it);
  for (Value* out : outs) {
    if (!out) continue;
    out->producer_ = nullptr;
    remove_value(out);
  }
}

void Graph::remove_value(Value* v) {
  OT_CHECK(v->owner_ == this, "graph '", name, "': value '", v->name(), "' is not in this graph");
  OT_CHECK(!v->producer_ && v->uses_.empty() && !v->is_input_ && !v->is_graph_output(), "graph '",
           name, "': value '", v->name(), "' is still connected");
  clear_initializer(v);
  by_name_.erase(v->name_);
  values_.erase(std::find_if(values_.begin(), values_.end(), [&](auto& p) { return p.get() == v; }));
}

void Graph::remove_nodes(const std::vector<Node*>& doomed) {
  const std::unordered_set<const Node*> gone(doomed.begin(), doomed.end());
  const std::unordered_set<const Value*> graph_outputs(outputs_.begin(), outputs_.end());
  // Uses from inside the subgraphs of doomed nodes (an If branch reading a value made in this
  // graph) go with them.
  std::unordered_set<const Node*> nested;
  std::vector<const Graph*> stack;
  for (const Node* n : doomed)
    for (const Attribute& a : n->attributes) {
      if (a.type == AttrType::kGraph) stack.push_back(&a.g());
      if (a.type == AttrType::kGraphs)
        for (const GraphPtr& sg : a.graphs()) stack.push_back(sg.get());
    }
  while (!stack.empty()) {
    const Graph* sg = stack.back();
    stack.pop_back();
    for (const auto& n : sg->nodes_) {
      nested.insert(n.get());
      for (const Attribute& a : n->attributes) {
        if (a.type == AttrType::kGraph) stack.push_back(&a.g());
        if (a.type == AttrType::kGraphs)
          for (const GraphPtr& g2 : a.graphs()) stack.push_back(g2.get());
      }
    }
  }
  std::unordered_set<const Value*> dead;
  for (Node* n : doomed) {
    OT_CHECK(n->owner_ == this, "graph '", name, "': ", n->describe(), " is not in this graph");
    for (Value* out : n->outputs_) {
      if (!out) continue;
      OT_CHECK(!graph_outputs.count(out), "graph '", name, "': cannot remove ", n->describe(),
               ": output '", out->name(), "' is a graph output");
      for (const Use& u : out->uses_)
        OT_CHECK(gone.count(u.node) || nested.count(u.node), "graph '", name,
                 "': cannot remove ", n->describe(),
                 ": output '", out->name(), "' is still used by ", u.node->describe());
      dead.insert(out);
    }
  }
  for (Node* n : doomed) {
    for (size_t i = 0; i < n->inputs_.size(); ++i) n->set_input(i, nullptr);
    n->attributes.clear();  // releases uses held by subgraphs
  }
  for (const Value* v : dead) {
    Value* out = const_cast<Value*>(v);
    out->producer_ = nullptr;
    clear_initializer(out);
    by_name_.erase(out->name_);
  }
  std::erase_if(nodes_, [&](const std::unique_ptr<Node>& p) { return gone.count(p.get()) > 0; });
  std::erase_if(values_, [&](const std::unique_ptr<Value>& p) { return dead.count(p.get()) > 0; });
}

void Graph::remove_values(const std::vector<Value*>& values) {
  const std::unordered_set<const Value*> graph_outputs(outputs_.begin(), outputs_.end());
  const std::unordered_set<const Value*> gone(values.begin(), values.end());
  for (Value* v : values) {
    OT_CHECK(v->owner_ == this, "graph '", name, "': value '", v->name(), "' is not in this graph");
    OT_CHECK(!v->producer_ && v->uses_.empty() && !v->is_input_ && !graph_outputs.count(v),
             "graph '", name, "': value '", v->name(), "' is still connected");
    clear_initializer(v);
    by_name_.erase(v->name_);
  }
  std::erase_if(values_, [&](const std::unique_ptr<Value>& p) { return gone.count(p.get()) > 0; });
}

void Graph::replace_all_uses(Value* from, Value* to) {
  if (from == to) return;
  std::vector<Use> uses = from->uses_;
  for (const Use& u : uses) u.node->set_input(static_cast<size_t>(u.input_index), to);
  for (Value*& o : outputs_)
    if (o == from) o = to;
}

// ---------------------------------------------------------------- Model

Model::Model() : graph(std::make_unique<Graph>()) {}

std::optional<int64_t> Model::opset_version(std::string_view d) const {
  bool want_default = d.empty() || d == "ai.onnx";
  for (const auto& o : opsets) {
    bool is_default = o.domain.empty() || o.domain == "ai.onnx";
    if (o.domain == d || (want_default && is_default)) return o.version;
  }
  return std::nullopt;
}

void Model::set_opset(const std::string& d, int64_t version) {
  for (auto& o : opsets)
    if (o.domain == d) {
      o.version = version;
      return;
    }
  opsets.push_back({d, version});
}

std::unique_ptr<Model> Model::clone_if(const std::function<bool(const Node&)>& keep) const {
  return clone_with(graph->clone_if(keep));
}

std::unique_ptr<Model> Model::clone() const {
  return clone_with(graph->clone(nullptr));
}

std::unique_ptr<Model> Model::clone_with(std::unique_ptr<Graph> g) const {
  auto m = std::make_unique<Model>();
  m->ir_version = ir_version;
  m->opsets = opsets;
  m->producer_name = producer_name;
  m->producer_version = producer_version;
  m->domain = domain;
  m->model_version = model_version;
  m->doc_string = doc_string;
  m->metadata = metadata;
  m->source_path = source_path;
  m->training = training;
  m->graph = std::move(g);
  return m;
}

}  // namespace onnxtrain::graph
