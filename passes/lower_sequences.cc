// lower_sequences (passes.h): sequences with a static structure become the tensors they hold.
#include <algorithm>
#include <set>

#include "graph/error.h"
#include "ops/sequence/static_sequences.h"
#include "passes/passes.h"

namespace onnxtrain::passes {
namespace {

using graph::Attribute;
using graph::Node;
using graph::Tensor;
using graph::Value;

// Shape inference as far as it goes: an op without a schema elsewhere in the graph is
// reported by the caller (require_supported_ops), not here; types only get more precise.
ConstantValues infer_best_effort(graph::Model& model) {
  ConstantValues known = constant_initializers(*model.graph);
  DimValues dims;  // shape subgraphs over a symbolic batch: Reshape keeps the static dims
  for (Node* n : model.graph->topological_order()) {
    try {
      infer_node(model, *n, known, &dims);
    } catch (const Error&) {
    }
  }
  return known;
}

class Lowering {
 public:
  Lowering(graph::Model& model, const ops::StaticSequences& seqs, const ConstantValues& known)
      : g_(*model.graph), seqs_(seqs), known_(known), opset_(model.opset_version("").value_or(1)) {}

  int run() {
    std::vector<Node*> lowered;
    for (Node* n : g_.topological_order()) {
      if (!ops::is_sequence_op(*n) || seqs_.unlowerable.count(n)) continue;
      lower(*n);
      lowered.push_back(n);
    }
    // Readers first: every output is unused by the time its node goes.
    for (auto it = lowered.rbegin(); it != lowered.rend(); ++it) g_.remove_node(*it);
    return static_cast<int>(lowered.size());
  }

 private:
  std::string base(const Node& n) const { return n.name.empty() ? n.op_type : n.name; }

  Value* i64_constant(std::vector<int64_t> v, bool scalar, const std::string& hint) {
    std::vector<int64_t> dims;
    if (!scalar) dims.push_back(static_cast<int64_t>(v.size()));
    return g_.add_initializer(g_.fresh_name(hint),
                              Tensor::from_vector(graph::DataType::kInt64, dims, v));
  }

  Node* emit(Node& at, const std::string& op, const std::vector<Value*>& inputs,
             const std::vector<std::string>& outputs) {
    return g_.insert_node_before(&at, op, inputs, outputs, g_.fresh_name(base(at) + "/" + op));
  }
  Value* emit1(Node& at, const std::string& op, const std::vector<Value*>& inputs,
               const std::string& out_hint) {
    return emit(at, op, inputs, {g_.fresh_name(out_hint)})->output(0);
  }

  // Squeeze / Unsqueeze of one axis: the axes are an input from opset 13, an attribute before.
  Value* axes_op(Node& at, const std::string& op, Value* x, int64_t axis) {
    if (opset_ >= 13) {
      Value* axes = i64_constant({axis}, false, base(at) + "/axes");
      return emit1(at, op, {x, axes}, x->name() + "/" + op);
    }
    Node* n = emit(at, op, {x}, {g_.fresh_name(x->name() + "/" + op)});
    n->set_attr(Attribute::make_ints("axes", {axis}));
    return n->output(0);
  }

  // `n`'s tensor output `out` is now `value`; a graph output keeps its name through an Identity.
  void replace_output(Node& n, Value* value) {
    Value* out = n.output(0);
    if (!out) return;
    if (out->is_graph_output()) {
      Value* id = emit1(n, "Identity", {value}, out->name() + "/lowered");
      id->type = out->type;
      g_.replace_all_uses(out, id);
      const std::string name = out->name();
      g_.rename_value(out, g_.fresh_name(name + "/sequence"));
      g_.rename_value(id, name);
    } else {
      g_.replace_all_uses(out, value);
    }
  }

  // A position input, wrapped into [0, len) (or [0, len] for an insert).
  int64_t position(const Node& n, size_t i, int64_t fallback, int64_t len) {
    const Value* p = n.input(i);
    if (!p) return fallback;
    int64_t pos = *ops::constant_position(*constant(p));
    return pos < 0 ? pos + len : pos;
  }

  const Tensor* constant(const Value* v) const {
    auto it = known_.find(v);
    return it != known_.end() ? &it->second : ops::literal_constant(v);
  }

  std::vector<Value*> split(Node& n) {
    Value* x = n.input(0);
    const Value* split = n.input(1);
    const int64_t axis = n.attr_int("axis", 0);
    std::vector<int64_t> sizes;
    bool squeeze = false;
    const Tensor* given = split ? constant(split) : nullptr;
    if (given && given->rank() == 1) {
      const Tensor& t = *given;
      for (int64_t i = 0; i < t.numel(); ++i)
        sizes.push_back(t.dtype() == graph::DataType::kInt64 ? t.data_as<int64_t>()[i]
                                                             : t.data_as<int32_t>()[i]);
    } else {
      const auto rank = static_cast<int64_t>(x->type.shape->size());
      const int64_t dim =
          (*x->type.shape)[static_cast<size_t>(axis < 0 ? axis + rank : axis)].value;
      const int64_t step = given ? *ops::constant_position(*given) : 1;
      for (int64_t left = dim; left > 0; left -= step) sizes.push_back(std::min(left, step));
      squeeze = !split && n.attr_int("keepdims", 1) == 0;
    }
    if (sizes.empty()) return {};
    std::vector<std::string> names;
    const std::string stem = n.output(0) ? n.output(0)->name() : base(n);
    for (size_t i = 0; i < sizes.size(); ++i) names.push_back(g_.fresh_name(cat(stem, "/", i)));
    Node* s;
    if (opset_ >= 13) {
      s = emit(n, "Split", {x, i64_constant(sizes, false, base(n) + "/split")}, names);
    } else {
      s = emit(n, "Split", {x}, names);
      s->set_attr(Attribute::make_ints("split", sizes));
    }
    s->set_attr(Attribute::make_int("axis", axis));
    std::vector<Value*> pieces = s->outputs();
    if (squeeze)
      for (Value*& p : pieces) p = axes_op(n, "Squeeze", p, axis);
    return pieces;
  }

  void lower(Node& n) {
    const std::string& op = n.op_type;
    std::vector<Value*> in =
        op == "SplitToSequence" || op == "SequenceConstruct" || op == "SequenceEmpty"
            ? std::vector<Value*>{}
            : elems_.at(n.input(0));
    const auto len = static_cast<int64_t>(in.size());
    if (op == "SplitToSequence") {
      elems_[n.output(0)] = split(n);
    } else if (op == "SequenceConstruct") {
      elems_[n.output(0)] = n.inputs();
    } else if (op == "SequenceEmpty") {
      elems_[n.output(0)] = {};
    } else if (op == "SequenceInsert") {
      in.insert(in.begin() + position(n, 2, len, len), n.input(1));
      elems_[n.output(0)] = in;
    } else if (op == "SequenceErase") {
      in.erase(in.begin() + position(n, 1, len - 1, len));
      elems_[n.output(0)] = in;
    } else if (op == "SequenceAt") {
      replace_output(n, in.at(static_cast<size_t>(position(n, 1, 0, len))));
    } else if (op == "SequenceLength") {
      Node* c = emit(n, "Constant", {}, {g_.fresh_name(n.output(0)->name() + "/length")});
      c->set_attr(Attribute::make_tensor(
          "value", Tensor::from_vector(graph::DataType::kInt64, {}, std::vector<int64_t>{len})));
      replace_output(n, c->output(0));
    } else if (op == "ConcatFromSequence") {
      const int64_t axis = n.attr_int("axis", 0);
      if (n.attr_int("new_axis", 0) != 0)
        for (Value*& v : in) v = axes_op(n, "Unsqueeze", v, axis);
      Value* out = n.output(0);
      Node* c = emit(n, "Concat", in, {g_.fresh_name(out->name() + "/concat")});
      c->set_attr(Attribute::make_int("axis", axis));
      replace_output(n, c->output(0));
    }
  }

  graph::Graph& g_;
  const ops::StaticSequences& seqs_;
  const ConstantValues& known_;
  int64_t opset_;
  std::map<const Value*, std::vector<Value*>> elems_;  // sequence -> the tensors it holds
};

}  // namespace

SequenceLowering lower_sequences(graph::Model& model, bool require_all) {
  SequenceLowering out;
  graph::Graph& g = *model.graph;
  if (std::none_of(g.nodes().begin(), g.nodes().end(),
                   [](const auto& n) { return ops::is_sequence_op(*n); }))
    return out;
  ConstantValues known = infer_best_effort(model);
  auto constant_of = [&](const Value* v) -> const Tensor* {
    auto it = known.find(v);
    return it != known.end() ? &it->second : ops::literal_constant(v);
  };
  const ops::StaticSequences seqs = ops::analyze_sequences(g, constant_of, false);
  for (const Node* n : seqs.stay_order) out.unlowered.push_back(seqs.unlowerable.at(n));
  if (require_all && !out.unlowered.empty()) {
    fail(model.source_path.empty() ? "model" : model.source_path,
         ": sequence ops that cannot be lowered to tensor ops: ",
         ops::describe_unlowered(out.unlowered));
  }
  out.lowered = Lowering(model, seqs, known).run();
  if (out.lowered > 0) infer_best_effort(model);
  return out;
}

}  // namespace onnxtrain::passes
