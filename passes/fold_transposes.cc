// fold_transposes (passes.h): the Transposes of a training graph that only swap a matrix
// product's operand or result into place, folded into the product.
#include <string>
#include <vector>

#include "graph/error.h"
#include "ops/op_api.h"
#include "passes/passes.h"

namespace onnxtrain::passes {
namespace {

using graph::Node;
using graph::Value;

// The rank of a Transpose's input, from its perm or its shape; -1 when unknown.
int64_t transpose_rank(const Node& t) {
  if (const graph::Attribute* p = t.find_attr("perm")) return static_cast<int64_t>(p->ints().size());
  const Value* x = t.inputs().empty() ? nullptr : t.input(0);
  return x && x->type.shape ? static_cast<int64_t>(x->type.shape->size()) : -1;
}

// Whether `t` is an ai.onnx Transpose that swaps exactly the last two dims of a rank >= 2 input
// (perm [0, .., r-3, r-1, r-2]; no perm reverses all dims, which is that for rank 2).
bool swaps_last2(const Node* t) {
  if (!t || t->op_type != "Transpose" || !t->domain.empty() || t->inputs().size() != 1 ||
      !t->input(0) || t->outputs().size() != 1)
    return false;
  const int64_t r = transpose_rank(*t);
  if (r < 2) return false;
  const graph::Attribute* p = t->find_attr("perm");
  if (!p) return r == 2;
  const std::vector<int64_t>& perm = p->ints();
  for (int64_t i = 0; i < r - 2; ++i)
    if (perm[static_cast<size_t>(i)] != i) return false;
  return perm[static_cast<size_t>(r - 2)] == r - 1 && perm[static_cast<size_t>(r - 1)] == r - 2;
}

bool rank2(const Value* v) { return v && v->type.shape && v->type.shape->size() == 2; }

bool is_matmul(const Node& n) {
  return (n.domain.empty() && n.op_type == "MatMul") ||
         (n.domain == ops::kOnnxtrainDomain && n.op_type == "FusedMatMul");
}

}  // namespace

TransposeFoldStats fold_transposes(graph::Model& model) {
  OT_CHECK(model.graph, "fold_transposes: the model has no graph");
  graph::Graph& g = *model.graph;
  TransposeFoldStats stats;
  // 1. Transpose(Gemm(A, B)) with no C -> Gemm(B, A) with the flags swapped and negated:
  //    (op(A) op(B))^T = op(B)^T op(A)^T; a 2-D MatMul's likewise, as a FusedMatMul. MatMul's
  //    gradient for a Linear's transposed weight (dynamo's Transpose ahead of the MatMul)
  //    computes dW^T as one Gemm (a 2-D MatMul for a 2-D input) and transposes it. First, so
  //    that step 2 folds the Transposes among the swapped operands.
  std::vector<Node*> transposes;
  for (const auto& up : g.nodes())
    if (swaps_last2(up.get()) && transpose_rank(*up) == 2) transposes.push_back(up.get());
  for (Node* t : transposes) {
    Value* y = t->input(0);
    Node* gemm = y->producer();
    if (!gemm || y->is_graph_output() || y->uses().size() != 1) continue;
    const bool is_gemm = gemm->op_type == "Gemm" && gemm->domain.empty() &&
                         (gemm->inputs().size() < 3 || !gemm->input(2));
    if (!is_gemm && !(is_matmul(*gemm) && gemm->inputs().size() == 2 && rank2(gemm->input(0)) &&
                      rank2(gemm->input(1))))
      continue;
    Value* a = gemm->input(0);
    Value* b = gemm->input(1);
    const int64_t ta = gemm->attr_int("transA", 0) != 0, tb = gemm->attr_int("transB", 0) != 0;
    gemm->set_input(0, b);
    gemm->set_input(1, a);
    if (!is_gemm) {
      gemm->domain = ops::kOnnxtrainDomain;
      gemm->op_type = "FusedMatMul";
    }
    gemm->set_attr(graph::Attribute::make_int("transA", tb ? 0 : 1));
    gemm->set_attr(graph::Attribute::make_int("transB", ta ? 0 : 1));
    // The Gemm now writes the Transpose's result, under its name (the gradient records).
    Value* out = t->output(0);
    const std::string name = out->name();
    g.replace_all_uses(out, y);
    g.remove_node(t);
    g.rename_value(y, name);
    y->type.shape.reset();  // infer_shapes gives it the transposed shape
    ++stats.gemm_outputs;
  }
  // 2. MatMul(.., Transpose(x)) -> FusedMatMul(.., x, trans = 1), repeatedly (a Transpose of a
  //    Transpose toggles back: MatMul's gradient transposes the Transpose of a Linear's weight).
  for (const auto& up : g.nodes()) {
    Node* n = up.get();
    if (!is_matmul(*n) || n->inputs().size() != 2) continue;
    for (size_t i = 0; i < 2; ++i) {
      const char* attr = i == 0 ? "transA" : "transB";
      while (n->input(i) && swaps_last2(n->input(i)->producer())) {
        const Node* t = n->input(i)->producer();
        const int64_t flag = n->attr_int(attr, 0) != 0 ? 0 : 1;
        if (n->domain.empty()) {
          n->domain = ops::kOnnxtrainDomain;
          n->op_type = "FusedMatMul";
        }
        n->set_attr(graph::Attribute::make_int(attr, flag));
        n->set_input(i, t->input(0));
        ++stats.matmul_operands;
      }
    }
    // Both flags off again: the ONNX MatMul it was.
    if (n->domain == ops::kOnnxtrainDomain && n->attr_int("transA", 0) == 0 &&
        n->attr_int("transB", 0) == 0) {
      n->domain.clear();
      n->op_type = "MatMul";
      std::erase_if(n->attributes, [](const graph::Attribute& a) {
        return a.name == "transA" || a.name == "transB";
      });
    }
  }
  if (stats.matmul_operands + stats.gemm_outputs > 0) model.set_opset(ops::kOnnxtrainDomain, 1);
  return stats;
}

}  // namespace onnxtrain::passes
