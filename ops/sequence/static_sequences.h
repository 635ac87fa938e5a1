// The static structure of ONNX sequence values: which sequence ops can be rewritten into tensor
// ops because every sequence's length and every position is known before the run. One analysis
// serves passes::lower_sequences (which rewrites them) and runtime::require_supported_ops
// (which accepts a model whose sequences the pass will lower, and names the nodes it cannot).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/tensor.h"

namespace onnxtrain::ops {

// SplitToSequence, SequenceConstruct, SequenceEmpty, SequenceAt, SequenceLength,
// SequenceInsert, SequenceErase, ConcatFromSequence (ai.onnx).
bool is_sequence_op(const graph::Node& n);

// The constant value of v, or nullptr (positions, split sizes).
using ConstantOf = std::function<const graph::Tensor*(const graph::Value*)>;
// An initializer that is not a graph input, or a Constant node's `value`.
const graph::Tensor* literal_constant(const graph::Value* v);

struct StaticSequences {
  // Length of every sequence value the lowering replaces; nullopt when it depends on a dim
  // the value types do not tell yet (only with `assume_dims`).
  std::map<const graph::Value*, std::optional<int64_t>> length;
  // Sequence-op nodes that must stay, each with a one-line reason naming the node.
  std::map<const graph::Node*, std::string> unlowerable;
  // The same nodes, causes first: those with a reason of their own, then those that stay
  // because a sequence they share does.
  std::vector<const graph::Node*> stay_order;
};

// Analyses the sequence ops of `g` (a main graph; those in subgraphs always stay). A sequence
// stays a run-time value (and every sequence op touching it stays) when it is a graph input or
// output, is read by any other op (Loop, If, Scan, a subgraph), or its length or a position is
// not static. `assume_dims`: a SplitToSequence length that depends on a dim the types do not
// know counts as static (the pass decides after shape inference).
StaticSequences analyze_sequences(const graph::Graph& g, const ConstantOf& constant_of,
                                  bool assume_dims);

// The reasons sequence ops stay (one line per node), for an error's single line: the first
// `shown` joined by "; ", then how many more ("...; and 41 more of 44").
std::string describe_unlowered(const std::vector<std::string>& why, size_t shown = 3);

// The position input `pos` of a sequence op as a number: constant scalar int32/int64.
std::optional<int64_t> constant_position(const graph::Tensor& t);

}  // namespace onnxtrain::ops
