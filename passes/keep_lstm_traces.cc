// keep_lstm_traces: the LSTM gradient reads the forward's gates instead of recomputing them
// (passes.h). The forward node changes op (ai.onnx LSTM -> ai.onnxtrain LSTMTraining: the same
// inputs, attributes and outputs, and output 3, its trace) and the LSTMGrad reads that trace as
// input 10 (ops/nn/rnn.cc says what the trace holds).
#include <string>

#include "ops/op_api.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

int keep_lstm_traces(graph::Model& model) {
  graph::Graph& g = *model.graph;
  constexpr size_t kY = 9, kTrace = 10;  // LSTMGrad's inputs (ops/nn/rnn.cc)
  int kept = 0;
  for (const auto& up : g.nodes()) {
    graph::Node* grad = up.get();
    if (grad->op_type != "LSTMGrad" || grad->domain != ops::kOnnxtrainDomain ||
        grad->inputs().size() != kY + 1 || !grad->input(kY))
      continue;
    // Its forward: the ai.onnx LSTM whose Y (output 0) it reads. Any other reader of Y is fine;
    // the forward's outputs 0-2 do not change.
    graph::Value* y = grad->input(kY);
    graph::Node* forward = y->producer();
    if (!forward || forward->op_type != "LSTM" || !forward->domain.empty() ||
        forward->output(0) != y || forward->outputs().size() > 3)
      continue;
    forward->op_type = "LSTMTraining";
    forward->domain = ops::kOnnxtrainDomain;
    graph::Value* trace = g.add_node_output(forward, 3, g.fresh_name(y->name() + "_trace"));
    trace->type.dtype = y->dtype();
    grad->set_input(kTrace, trace);
    ++kept;
  }
  return kept;
}

}  // namespace onnxtrain::passes
