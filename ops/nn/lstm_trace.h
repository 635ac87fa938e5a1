// The slots passes::keep_lstm_traces connects and the LSTM kernels (ops/nn/rnn.cc) read: an
// ai.onnxtrain LSTMTraining node is an LSTM that also writes its trace (the gates after
// activation and the h and c states of every step, rnn.cc's lstm_trace_size) as output
// kLstmTraceOutput; its ai.onnxtrain LSTMGrad reads the forward's Y at kLstmGradY and that trace
// at kLstmGradTrace, and then recomputes nothing.
#pragma once

namespace onnxtrain::ops {

inline constexpr char kLstmTrainingOp[] = "LSTMTraining";
// After Y, Y_h and Y_c.
inline constexpr int kLstmTraceOutput = 3;
// After dY, dY_h, dY_c, X, W, R, B, initial_h and initial_c.
inline constexpr int kLstmGradY = 9;
inline constexpr int kLstmGradTrace = 10;

}  // namespace onnxtrain::ops
