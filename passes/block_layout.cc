// Training graphs on CPU devices: values passed between convolutions keep oneDNN's blocked
// channel layout (ops/nn/blocked_layout.h), so Conv / ConvGrad stop reordering them every step.
// Layout is a property of a set of values, not of one: an elementwise node (Relu, Add, Sum,
// ReluGrad, Cast over one shape) computes the same in any layout as long as all its operands
// share it, and BatchNormalization(Grad) marked `blocked` reads and writes all its activations
// blocked. Those nodes join their operands into one set (union-find); a set is blocked when
// every member can be and every other node touching it reads or writes it through a port that
// takes the layout (Conv x / y, ConvGrad dy / x / dx) or reads only its shape or dtype (Shape,
// Size, CastLike's target). Everything else sees plain values.
#include <unordered_map>
#include <unordered_set>

#include "ops/nn/batch_norm_relu.h"
#include "ops/nn/blocked_layout.h"
#include "ops/op_api.h"
#include "passes/pass_util.h"
#include "passes/passes.h"

namespace onnxtrain::passes {
namespace {

using graph::DataType;
using graph::Node;
using graph::Value;

// A value that may live blocked: an (N, C, H, W) activation with C dividing into blocks, in a
// dtype the blocked kernels take, computed by a node of this graph and not seen from outside.
bool blockable(const Value* v, const std::unordered_set<const Value*>& captured) {
  if (!v || !v->shape() || v->shape()->size() != 4 || v->is_graph_input() ||
      v->is_graph_output() || v->has_initializer() || !v->producer() || captured.count(v))
    return false;
  const graph::Dim& c = (*v->shape())[1];
  return c.is_known() && ops::can_block_channels(c.value) &&
         (v->dtype() == DataType::kFloat || v->dtype() == DataType::kBFloat16);
}

// The activations a node reads and writes in one layout (all blocked or all plain), or an empty
// list when the node is no such join. BatchNormalization(Grad) in training mode over 4-D
// activations; elementwise ops over one shape.
std::vector<Value*> joined_operands(const Node* n) {
  std::vector<Value*> vs;
  const bool bn = is_op(*n, "", "BatchNormalization") && n->attr_int("training_mode", 0) != 0;
  const bool bn_grad = is_op(*n, ops::kOnnxtrainDomain, "BatchNormalizationGrad") &&
                       n->attr_int("training_mode", 0) != 0 && n->attr_int("spatial", 1) != 0;
  if (bn) {
    vs = {n->input(0), n->output(0)};
    if (n->attr_int(std::string(ops::kFusedAddAttr), 0) != 0)
      vs.push_back(n->input(ops::kBatchNormResidualInput));
  } else if (bn_grad) {
    vs = {n->input(0), n->input(1), n->output(0)};
    if (n->attr_int(std::string(ops::kFusedReluAttr), 0) != 0)
      vs.push_back(n->input(ops::kBatchNormGradReluOutput));
  } else if (is_op(*n, "", "Relu") || is_op(*n, "", "Add") || is_op(*n, "", "Sum") ||
             is_op(*n, "", "Cast") || is_op(*n, ops::kOnnxtrainDomain, "ReluGrad")) {
    vs = n->inputs();
    vs.insert(vs.end(), n->outputs().begin(), n->outputs().end());
  } else {
    return {};
  }
  for (const Value* v : vs)
    if (!v || !same_static_shape(v, vs[0])) return {};
  return vs;
}

// The port attribute through which `n` reads input `i` (output `o` when i < 0) in any layout,
// or nullptr. Conv and ConvGrad over 2-D maps only (what their blocked kernels cover).
const char* port(const Node* n, int i, int o) {
  if (is_op(*n, "", "Conv")) {
    if (i == 0) return ops::kXBlockedAttr;
    if (o == 0) return ops::kYBlockedAttr;
  } else if (is_op(*n, ops::kOnnxtrainDomain, "ConvGrad")) {
    if (i == 0) return ops::kDyBlockedAttr;
    if (i == 1) return ops::kXBlockedAttr;
    if (o == 0) return ops::kDxBlockedAttr;
  }
  return nullptr;
}

// Reads only the metadata of input i (its shape or dtype), never its elements: Shape, Size, and
// CastLike's target (torch's dynamo exporter reads activations so, for their dtype). Such a use
// does not care about the layout.
bool reads_metadata_only(const Node* n, int i) {
  return is_op(*n, "", "Shape") || is_op(*n, "", "Size") || (is_op(*n, "", "CastLike") && i == 1);
}

class Sets {
 public:
  int find(int a) { return parent_[a] == a ? a : parent_[a] = find(parent_[a]); }
  int id(const Value* v) {
    auto [it, fresh] = ids_.emplace(v, static_cast<int>(parent_.size()));
    if (fresh) parent_.push_back(it->second);
    return it->second;
  }
  void join(int a, int b) { parent_[find(a)] = find(b); }
  const std::unordered_map<const Value*, int>& ids() const { return ids_; }

 private:
  std::vector<int> parent_;
  std::unordered_map<const Value*, int> ids_;
};

}  // namespace

BlockLayoutStats block_layout(graph::Model& model) {
  graph::Graph& g = *model.graph;
  const std::unordered_set<const Value*> captured = captured_by_subgraphs(g);

  // Join the operands of each join node; remember which nodes joined.
  Sets sets;
  std::unordered_map<const Node*, std::vector<Value*>> joins;
  for (const auto& up : g.nodes()) {
    std::vector<Value*> vs = joined_operands(up.get());
    if (vs.empty()) continue;
    for (const Value* v : vs) sets.join(sets.id(v), sets.id(vs[0]));
    joins.emplace(up.get(), std::move(vs));
  }
  // Every activation a port touches is a candidate too (a set of its own when nothing joins it).
  for (const auto& up : g.nodes()) {
    const Node* n = up.get();
    for (size_t i = 0; i < n->inputs().size(); ++i)
      if (n->input(i) && port(n, static_cast<int>(i), -1)) sets.id(n->input(i));
    for (size_t o = 0; o < n->outputs().size(); ++o)
      if (n->output(o) && port(n, -1, static_cast<int>(o))) sets.id(n->output(o));
  }

  // A set is blocked unless one member cannot be, or a node touches a member other than through
  // a join or a port.
  std::unordered_map<int, bool> ok;
  for (const auto& [v, id] : sets.ids()) {
    const int root = sets.find(id);
    bool good = blockable(v, captured);
    const Node* p = v->producer();
    if (good && !joins.count(p) && !port(p, -1, v->producer_output())) good = false;
    for (const graph::Use& u : v->uses())
      if (good && !joins.count(u.node) && !port(u.node, static_cast<int>(u.input_index), -1) &&
          !reads_metadata_only(u.node, static_cast<int>(u.input_index)))
        good = false;
    auto [it, fresh] = ok.emplace(root, good);
    if (!fresh) it->second = it->second && good;
  }
  auto blocked = [&](const Value* v) {
    auto it = sets.ids().find(v);
    return it != sets.ids().end() && ok.at(sets.find(it->second));
  };

  BlockLayoutStats stats;
  for (const auto& [v, id] : sets.ids())
    if (ok.at(sets.find(id))) ++stats.blocked_values;
  for (const auto& up : g.nodes()) {
    Node* n = up.get();
    auto j = joins.find(n);
    if (j != joins.end()) {
      if (!blocked(j->second[0])) continue;
      // Elementwise joins compute the same in any layout and carry no mark.
      if (is_op(*n, "", "BatchNormalization") ||
          is_op(*n, ops::kOnnxtrainDomain, "BatchNormalizationGrad")) {
        n->set_attr(graph::Attribute::make_int(std::string(ops::kBlockedAttr), 1));
        ++stats.batchnorms;
      }
      continue;
    }
    bool any = false;
    for (size_t i = 0; i < n->inputs().size(); ++i)
      if (const char* a = port(n, static_cast<int>(i), -1); a && blocked(n->input(i))) {
        n->set_attr(graph::Attribute::make_int(a, 1));
        any = true;
      }
    for (size_t o = 0; o < n->outputs().size(); ++o)
      if (const char* a = port(n, -1, static_cast<int>(o)); a && blocked(n->output(o))) {
        n->set_attr(graph::Attribute::make_int(a, 1));
        any = true;
      }
    if (any) ++stats.convolutions;
  }
  return stats;
}

}  // namespace onnxtrain::passes
