// Which sequence ops have a static structure (static_sequences.h).
#include "ops/sequence/static_sequences.h"

#include <set>

#include "graph/error.h"

namespace onnxtrain::ops {
namespace {

// Ops whose input 0 is a sequence; ops whose output 0 is one.
bool reads_sequence(const graph::Node& n) {
  static const std::set<std::string> ops = {"SequenceAt", "SequenceLength", "SequenceInsert",
                                            "SequenceErase", "ConcatFromSequence"};
  return ops.count(n.op_type) != 0;
}
bool makes_sequence(const graph::Node& n) {
  static const std::set<std::string> ops = {"SplitToSequence", "SequenceConstruct", "SequenceEmpty",
                                            "SequenceInsert", "SequenceErase"};
  return ops.count(n.op_type) != 0;
}

std::string quoted(const graph::Value* v) {
  return cat("'", v->name(), "'");
}

class Analysis {
 public:
  Analysis(const graph::Graph& g, const ConstantOf& constant_of, bool assume_dims)
      : g_(g), constant_of_(constant_of), assume_dims_(assume_dims) {}

  StaticSequences run() {
    std::vector<const graph::Node*> seq_nodes;
    for (const graph::Node* n : g_.topological_order())
      if (is_sequence_op(*n)) seq_nodes.push_back(n);
    for (const graph::Node* n : seq_nodes) visit(*n);
    // A sequence that something other than a lowerable sequence op needs stays a sequence.
    for (const graph::Node* n : seq_nodes) {
      if (out_.unlowerable.count(n) || !makes_sequence(*n) || !n->output(0)) continue;
      const graph::Value* s = n->output(0);
      if (s->is_graph_output()) {
        stay(*n, cat("its sequence ", quoted(s), " is a graph output"));
        continue;
      }
      for (const graph::Use& u : s->uses())
        if (u.node->owner() != &g_ || !reads_sequence(*u.node) || u.input_index != 0) {
          stay(*n, cat("its sequence ", quoted(s), " is read by ", u.node->describe(),
                       ", which needs a run-time sequence"));
          break;
        }
    }
    // Whatever touches a sequence that stays stays too, until nothing changes.
    for (bool changed = true; changed;) {
      changed = false;
      for (const graph::Node* n : seq_nodes) {
        if (out_.unlowerable.count(n)) continue;
        const graph::Value* in = reads_sequence(*n) ? n->input(0) : nullptr;
        if (in && in->producer() && out_.unlowerable.count(in->producer())) {
          stay(*n, cat("it reads ", quoted(in), " from ", in->producer()->describe(),
                       ", which is not lowered"));
          changed = true;
          continue;
        }
        const graph::Value* s = makes_sequence(*n) ? n->output(0) : nullptr;
        for (const graph::Use& u : s ? s->uses() : std::vector<graph::Use>{})
          if (out_.unlowerable.count(u.node)) {
            stay(*n, cat("its sequence ", quoted(s), " is read by ", u.node->describe(),
                         ", which is not lowered"));
            changed = true;
            break;
          }
      }
    }
    for (const auto& [n, why] : out_.unlowerable)
      if (makes_sequence(*n) && n->output(0)) out_.length.erase(n->output(0));
    return std::move(out_);
  }

 private:
  void stay(const graph::Node& n, const std::string& why) {
    if (out_.unlowerable.emplace(&n, cat(n.describe(), ": ", why)).second)
      out_.stay_order.push_back(&n);
  }

  // The length of n's input sequence when it is one this analysis lowers.
  bool input_length(const graph::Node& n, std::optional<int64_t>& len) {
    const graph::Value* s = n.input(0);
    if (!s) {
      stay(n, "it has no sequence input");
      return false;
    }
    auto it = out_.length.find(s);
    if (it != out_.length.end()) {
      len = it->second;
      return true;
    }
    if (s->is_graph_input())
      stay(n, cat("it reads the graph input ", quoted(s), ", a run-time sequence"));
    else if (s->producer() && s->producer()->owner() == &g_ && is_sequence_op(*s->producer()))
      stay(n, cat("it reads ", quoted(s), " from ", s->producer()->describe(),
                  ", which is not lowered"));
    else if (s->producer())
      stay(n, cat("it reads ", quoted(s), " from ", s->producer()->describe(),
                  ", a run-time sequence"));
    else
      stay(n, cat("it reads ", quoted(s), ", a run-time sequence"));
    return false;
  }

  // Position input `i` (optional unless `required`), checked against [lo, hi] when len is known.
  bool position(const graph::Node& n, size_t i, bool required, std::optional<int64_t> lo,
                std::optional<int64_t> hi) {
    const graph::Value* p = n.input(i);
    if (!p) {
      if (required) stay(n, "it has no position input");
      return !required;
    }
    const graph::Tensor* t = constant_of_(p);
    std::optional<int64_t> pos = t ? constant_position(*t) : std::nullopt;
    if (!pos) {
      stay(n, cat("its position ", quoted(p), " is not a constant scalar"));
      return false;
    }
    if (lo && hi && (*pos < *lo || *pos > *hi)) {
      stay(n, cat("its position ", *pos, " is outside [", *lo, ", ", *hi, "]"));
      return false;
    }
    return true;
  }

  std::optional<int64_t> split_count(const graph::Node& n, bool& ok) {
    ok = true;
    const graph::Value* x = n.input(0);
    const graph::Value* split = n.input(1);
    const graph::Tensor* sizes = split ? constant_of_(split) : nullptr;
    if (split && !sizes) {
      // A split computed from shapes (torch.split on a static axis, as the classic exporter
      // writes it) may still fold once shapes are inferred: the pass decides.
      if (assume_dims_) {
        const auto& shape = split->type.shape;
        if (shape && shape->size() == 1 && (*shape)[0].is_known()) return (*shape)[0].value;
        return std::nullopt;  // a scalar size, or a length not known: the count is unknown
      }
      ok = false;
      stay(n, cat("its split ", quoted(split), " is not a constant"));
      return std::nullopt;
    }
    if (sizes && sizes->rank() == 1) return sizes->numel();
    if (sizes && sizes->rank() != 0) {
      ok = false;
      stay(n, cat("its split ", quoted(split), " has rank ", sizes->rank()));
      return std::nullopt;
    }
    int64_t step = 1;
    if (sizes) {
      std::optional<int64_t> s = constant_position(*sizes);
      if (!s || *s <= 0) {
        ok = false;
        stay(n, cat("its split ", quoted(split), " is not a positive integer"));
        return std::nullopt;
      }
      step = *s;
    }
    std::optional<int64_t> dim;
    int64_t axis = n.attr_int("axis", 0);
    if (x && x->type.is_tensor() && x->type.shape) {
      const auto rank = static_cast<int64_t>(x->type.shape->size());
      if (axis < -rank || axis >= rank) {
        ok = false;
        stay(n, cat("its axis ", axis, " is outside the rank ", rank, " of ", quoted(x)));
        return std::nullopt;
      }
      const graph::Dim& d = (*x->type.shape)[static_cast<size_t>(axis < 0 ? axis + rank : axis)];
      if (d.is_known()) dim = d.value;
    }
    if (!dim) {
      if (assume_dims_) return std::nullopt;
      ok = false;
      stay(n, cat("the number of pieces is not static (axis ", axis, " of ",
                  x ? quoted(x) : std::string("its input"), " has no known size)"));
      return std::nullopt;
    }
    return (*dim + step - 1) / step;
  }

  void visit(const graph::Node& n) {
    if (g_.depth() > 0) {
      stay(n, "only sequences of the main graph are lowered");
      return;
    }
    const std::string& op = n.op_type;
    std::optional<int64_t> len;
    if (op == "SequenceEmpty") {
      out_.length[n.output(0)] = 0;
    } else if (op == "SequenceConstruct") {
      out_.length[n.output(0)] = static_cast<int64_t>(n.inputs().size());
    } else if (op == "SplitToSequence") {
      bool ok = false;
      std::optional<int64_t> count = split_count(n, ok);
      if (ok) out_.length[n.output(0)] = count;
    } else if (!input_length(n, len)) {
      return;
    } else if (op == "SequenceAt") {
      if (len && *len == 0) return stay(n, "its sequence is empty");
      if (!position(n, 1, true, len ? std::optional(-*len) : std::nullopt,
                    len ? std::optional(*len - 1) : std::nullopt))
        return;
    } else if (op == "SequenceInsert") {
      if (!position(n, 2, false, len ? std::optional(-*len) : std::nullopt, len)) return;
      out_.length[n.output(0)] = len ? std::optional(*len + 1) : std::nullopt;
    } else if (op == "SequenceErase") {
      if (len && *len == 0) return stay(n, "its sequence is empty");
      if (!position(n, 1, false, len ? std::optional(-*len) : std::nullopt,
                    len ? std::optional(*len - 1) : std::nullopt))
        return;
      out_.length[n.output(0)] = len ? std::optional(*len - 1) : std::nullopt;
    } else if (op == "ConcatFromSequence") {
      if (len && *len == 0) return stay(n, "its sequence is empty");
    }
    // SequenceLength needs nothing more than a static input.
  }

  const graph::Graph& g_;
  const ConstantOf& constant_of_;
  bool assume_dims_;
  StaticSequences out_;
};

}  // namespace

bool is_sequence_op(const graph::Node& n) {
  if (!n.domain.empty() && n.domain != "ai.onnx") return false;
  return reads_sequence(n) || makes_sequence(n);
}

const graph::Tensor* literal_constant(const graph::Value* v) {
  if (!v) return nullptr;
  if (v->has_initializer()) return v->is_graph_input() ? nullptr : &v->initializer();
  const graph::Node* p = v->producer();
  if (!p || p->op_type != "Constant" || !(p->domain.empty() || p->domain == "ai.onnx"))
    return nullptr;
  const graph::Attribute* a = p->find_attr("value");
  return a && a->type == graph::AttrType::kTensor ? &a->t() : nullptr;
}

std::optional<int64_t> constant_position(const graph::Tensor& t) {
  if (t.numel() != 1 || t.rank() > 1) return std::nullopt;
  if (t.dtype() == graph::DataType::kInt64) return t.data_as<int64_t>()[0];
  if (t.dtype() == graph::DataType::kInt32) return t.data_as<int32_t>()[0];
  return std::nullopt;
}

StaticSequences analyze_sequences(const graph::Graph& g, const ConstantOf& constant_of,
                                  bool assume_dims) {
  return Analysis(g, constant_of, assume_dims).run();
}

std::string describe_unlowered(const std::vector<std::string>& why, size_t shown) {
  std::string out;
  for (size_t i = 0; i < why.size() && i < shown; ++i) out += cat(i ? "; " : "", why[i]);
  if (why.size() > shown) out += cat("; and ", why.size() - shown, " more of ", why.size());
  return out;
}

}  // namespace onnxtrain::ops
