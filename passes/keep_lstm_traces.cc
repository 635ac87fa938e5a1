// keep_lstm_traces: the LSTM gradient reads the forward's gates instead of recomputing them
// (passes.h). The forward node changes op (ai.onnx LSTM -> ai.onnxtrain LSTMTraining: the same
// inputs, attributes and outputs, and its trace) and the LSTMGrad reads that trace (the slots:
// ops/nn/lstm_trace.h; what the trace holds: ops/nn/rnn.cc).
#include <string>

#include "ops/nn/lstm_trace.h"
#include "ops/op_api.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

int keep_lstm_traces(graph::Model& model) {
  graph::Graph& g = *model.graph;
  constexpr size_t kY = ops::kLstmGradY;
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
        forward->output(0) != y || forward->outputs().size() > ops::kLstmTraceOutput)
      continue;
    forward->op_type = ops::kLstmTrainingOp;
    forward->domain = ops::kOnnxtrainDomain;
    graph::Value* trace =
        g.add_node_output(forward, ops::kLstmTraceOutput, g.fresh_name(y->name() + "_trace"));
    trace->type.dtype = y->dtype();
    grad->set_input(ops::kLstmGradTrace, trace);
    ++kept;
  }
  return kept;
}

}  // namespace onnxtrain::passes
