// Graph IR: what depends on what (captured values, topological order) and deep copies of
// nodes and graphs. The rest of the IR (ownership, edges, the mutation API) is in ir.cc.
#include <algorithm>
#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "graph/dependencies.h"
#include "graph/error.h"
#include "graph/ir.h"

namespace onnxtrain::graph {
std::vector<Value*> Graph::captured_values() const {
  std::vector<Value*> out;
  std::unordered_set<Value*> seen;
  // Inputs of nodes in nested graphs (and graph outputs: a branch may return an outer value
  // as is) that resolve outside `this`.
  auto note = [&](Value* in) {
    if (!in) return;
    bool inside = false;
    for (const Graph* o = in->owner_; o; o = o->parent_)
      if (o == this) inside = true;
    if (!inside && seen.insert(in).second) out.push_back(in);
  };
  std::vector<const Graph*> stack{this};
  while (!stack.empty()) {
    const Graph* g = stack.back();
    stack.pop_back();
    for (Value* v : g->outputs_) note(v);
    for (const auto& node : g->nodes_) {
      for (Value* in : node->inputs_) note(in);
      for (const auto& a : node->attributes) {
        if (a.type == AttrType::kGraph) stack.push_back(&a.g());
        if (a.type == AttrType::kGraphs)
          for (const auto& sg : a.graphs()) stack.push_back(sg.get());
      }
    }
  }
  return out;
}

std::vector<Value*> node_dependencies(const Node& n, const Graph& g) {
  std::vector<Value*> deps;
  for (Value* v : n.inputs())
    if (v && v->owner() == &g) deps.push_back(v);
  for (const auto& a : n.attributes) {
    std::vector<const Graph*> subs;
    if (a.type == AttrType::kGraph) subs.push_back(&a.g());
    if (a.type == AttrType::kGraphs)
      for (const auto& sg : a.graphs()) subs.push_back(sg.get());
    for (const Graph* sg : subs)
      for (Value* v : sg->captured_values())
        if (v->owner() == &g) deps.push_back(v);
  }
  return deps;
}

bool has_subgraphs(const Node& n) {
  return std::any_of(n.attributes.begin(), n.attributes.end(), [](const Attribute& a) {
    return a.type == AttrType::kGraph || a.type == AttrType::kGraphs;
  });
}

std::vector<Node*> Graph::topological_order() const {
  std::unordered_map<const Node*, size_t> index;
  for (size_t i = 0; i < nodes_.size(); ++i) index[nodes_[i].get()] = i;
  std::vector<int> pending(nodes_.size(), 0);
  std::vector<std::vector<size_t>> consumers(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    std::unordered_set<const Node*> producers;
    for (Value* v : node_dependencies(*nodes_[i], *this))
      if (v->producer_ && producers.insert(v->producer_).second) {
        ++pending[i];
        consumers[index.at(v->producer_)].push_back(i);
      }
  }
  // Stable: always take the lowest-index ready node.
  std::vector<size_t> ready;
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (pending[i] == 0) ready.push_back(i);
  std::make_heap(ready.begin(), ready.end(), std::greater<>());
  std::vector<Node*> order;
  order.reserve(nodes_.size());
  while (!ready.empty()) {
    std::pop_heap(ready.begin(), ready.end(), std::greater<>());
    size_t i = ready.back();
    ready.pop_back();
    order.push_back(nodes_[i].get());
    for (size_t c : consumers[i])
      if (--pending[c] == 0) {
        ready.push_back(c);
        std::push_heap(ready.begin(), ready.end(), std::greater<>());
      }
  }
  if (order.size() != nodes_.size()) {
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (pending[i] > 0)
        fail("graph '", name, "': cycle through ", nodes_[i]->describe());
  }
  return order;
}

void Graph::sort_topologically() {
  std::vector<Node*> order = topological_order();
  std::unordered_map<Node*, std::unique_ptr<Node>> owned;
  for (auto& p : nodes_) owned[p.get()] = std::move(p);
  nodes_.clear();
  for (Node* n : order) nodes_.push_back(std::move(owned[n]));
}

void Graph::move_to_end(std::span<Node* const> nodes) {
  std::unordered_map<const Node*, size_t> rank;
  for (size_t i = 0; i < nodes.size(); ++i)
    OT_CHECK(rank.emplace(nodes[i], i).second, "graph '", name, "': move_to_end: ",
             nodes[i]->describe(), " given twice");
  size_t found = 0;
  for (const auto& p : nodes_) found += rank.count(p.get());
  OT_CHECK(found == nodes.size(), "graph '", name, "': move_to_end: a node of another graph");
  std::vector<std::unique_ptr<Node>> moved(nodes.size());
  size_t kept = 0;
  for (auto& p : nodes_) {
    auto it = rank.find(p.get());
    if (it == rank.end())
      nodes_[kept++] = std::move(p);
    else
      moved[it->second] = std::move(p);
  }
  nodes_.resize(kept);
  for (auto& p : moved) nodes_.push_back(std::move(p));
}

namespace {

// Redirects what `sg` (and the graphs nested in it) reads from enclosing graphs through `map`:
// a cloned If / Loop reads the clones of the values its original read.
void remap_captures(Graph& sg, const std::unordered_map<const Value*, Value*>& map) {
  for (const auto& node : sg.nodes()) {
    for (size_t i = 0; i < node->inputs().size(); ++i) {
      auto it = node->input(i) ? map.find(node->input(i)) : map.end();
      if (it != map.end()) node->set_input(i, it->second);
    }
    for (Attribute& a : node->attributes) {
      if (a.type == AttrType::kGraph) remap_captures(a.g(), map);
      if (a.type == AttrType::kGraphs)
        for (const GraphPtr& p : a.graphs()) remap_captures(*p, map);
    }
  }
  std::vector<Value*> outs = sg.outputs();
  bool changed = false;
  for (Value*& v : outs)
    if (auto it = v ? map.find(v) : map.end(); it != map.end()) {
      v = it->second;
      changed = true;
    }
  if (changed) sg.set_outputs(std::move(outs));
}

}  // namespace

std::vector<Node*> Graph::clone_nodes(std::span<Node* const> nodes,
                                      const std::function<std::string(const std::string&)>& rename,
                                      std::unordered_map<const Value*, Value*>& value_map) {
  std::vector<Node*> clones;
  for (Node* n : nodes) {
    OT_CHECK(n->owner_ == this, "graph '", name, "': clone_nodes: ", n->describe(),
             " is not in this graph");
    std::vector<std::string> out_names;
    for (Value* o : n->outputs_) out_names.push_back(o ? rename(o->name()) : "");
    std::vector<Value*> ins;
    for (Value* in : n->inputs_) {
      auto it = in ? value_map.find(in) : value_map.end();
      ins.push_back(it != value_map.end() ? it->second : in);
    }
    Node* c = add_node(n->op_type, ins, out_names, n->name.empty() ? "" : rename(n->name),
                       n->domain);
    c->doc_string = n->doc_string;
    c->device = n->device;
    c->replica = n->replica;
    c->attributes = n->attributes;
    for (Attribute& a : c->attributes) {
      if (a.type == AttrType::kGraph) remap_captures(a.g(), value_map);
      if (a.type == AttrType::kGraphs)
        for (const GraphPtr& p : a.graphs()) remap_captures(*p, value_map);
    }
    for (size_t i = 0; i < n->outputs_.size(); ++i) {
      if (!n->outputs_[i]) continue;
      c->outputs_[i]->type = n->outputs_[i]->type;
      c->outputs_[i]->metadata = n->outputs_[i]->metadata;
      value_map[n->outputs_[i]] = c->outputs_[i];
    }
    clones.push_back(c);
  }
  return clones;
}

std::unique_ptr<Graph> Graph::clone(Graph* parent) const {
  return clone_filtered(parent, nullptr);
}

std::unique_ptr<Graph> Graph::clone_if(const std::function<bool(const Node&)>& keep) const {
  return clone_filtered(nullptr, &keep);
}

std::unique_ptr<Graph> Graph::clone_filtered(Graph* parent,
                                             const std::function<bool(const Node&)>* keep) const {
  auto g = std::make_unique<Graph>(name, parent);
  g->doc_string = doc_string;
  std::unordered_map<const Value*, Value*> map;
  auto copy_value = [&](const Value* v) {
    Value* c = g->add_value(v->name_, v->type);
    c->doc_string = v->doc_string;
    c->metadata = v->metadata;
    map[v] = c;
    return c;
  };
  std::unordered_set<const Node*> kept;
  if (keep)
    for (const auto& n : nodes_)
      if ((*keep)(*n)) kept.insert(n.get());
  // Without a filter every value without a producer; with one, graph inputs and what kept
  // nodes read.
  auto wanted = [&](const Value* v) {
    if (!keep || v->is_input_) return true;
    for (const Use& u : v->uses_)
      if (kept.count(u.node)) return true;
    return false;
  };
  for (const auto& v : values_)
    if (!v->producer_ && wanted(v.get())) copy_value(v.get());
  for (const Value* v : inputs_) g->mark_input(map.at(v));
  for (const Value* v : initializer_order_)
    if (map.count(v)) g->set_initializer(map.at(v), *v->initializer_);
  for (const auto& n : nodes_) {
    if (keep && !kept.count(n.get())) continue;
    std::vector<std::string> out_names;
    for (Value* o : n->outputs_) out_names.push_back(o ? o->name_ : "");
    std::vector<Value*> ins;
    for (Value* in : n->inputs_) {
      if (!in) {
        ins.push_back(nullptr);
      } else if (auto it = map.find(in); it != map.end()) {
        ins.push_back(it->second);
      } else {
        // Defined later in the list (unsorted) or captured from an enclosing graph.
        Value* outer = in->owner_ == this ? nullptr : (parent ? parent->lookup(in->name_) : nullptr);
        ins.push_back(outer ? outer : in);
      }
    }
    Node* c = g->add_node(n->op_type, {}, out_names, n->name, n->domain);
    c->doc_string = n->doc_string;
    c->device = n->device;
    c->replica = n->replica;
    for (size_t i = 0; i < n->outputs_.size(); ++i)
      if (n->outputs_[i]) {
        c->outputs_[i]->type = n->outputs_[i]->type;
        c->outputs_[i]->doc_string = n->outputs_[i]->doc_string;
        c->outputs_[i]->metadata = n->outputs_[i]->metadata;
        map[n->outputs_[i]] = c->outputs_[i];
      }
    for (size_t i = 0; i < ins.size(); ++i) c->set_input(i, ins[i]);
    // Subgraphs are re-cloned under the new graph so their captures resolve to our copies.
    for (const auto& a : n->attributes) {
      Attribute ca;
      ca.name = a.name;
      ca.type = a.type;
      ca.doc_string = a.doc_string;
      ca.ref_attr_name = a.ref_attr_name;
      if (a.type == AttrType::kGraph) {
        ca.value = GraphPtr(a.g().clone(g.get()));
      } else if (a.type == AttrType::kGraphs) {
        std::vector<GraphPtr> gs;
        for (const auto& sg : a.graphs()) gs.emplace_back(sg->clone(g.get()));
        ca.value = std::move(gs);
      } else {
        ca.value = a.value;
      }
      c->attributes.push_back(std::move(ca));
    }
  }
  // Second pass for inputs that referenced nodes later in an unsorted list.
  for (const auto& cn : g->nodes_)
    for (size_t i = 0; i < cn->inputs_.size(); ++i) {
      Value* in = cn->inputs_[i];
      if (in && in->owner_ == this) {
        auto it = map.find(in);
        OT_CHECK(it != map.end() || keep, "graph '", name, "': clone: '", in->name_, "' is unknown");
        cn->set_input(i, it != map.end() ? it->second : nullptr);  // made by a dropped node
      }
    }
  for (const Value* v : outputs_) {
    auto it = map.find(v);
    if (it == map.end() && keep) continue;  // made by a dropped node
    g->outputs_.push_back(it != map.end() ? it->second : (parent ? parent->lookup(v->name_) : nullptr));
  }
  return g;
}

}  // namespace onnxtrain::graph
