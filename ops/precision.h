// Mixed precision's facts about the kernels, in one place: which low-precision float types this
// machine's CPU kernels run natively (what --precision / passes::autocast asks before it casts
// Conv/Gemm/MatMul down), and the dtype a convolution computes in when its operands differ
// (the rule passes::autocast writes into the graph and the Conv / ConvGrad kernels and shape
// inference read).
#pragma once

#include <optional>

#include "graph/dtype.h"

namespace onnxtrain::ops {

// f32 always; bf16 with AVX512-BF16 or AMX (oneDNN's effective ISA); f16 never with this
// oneDNN (v2.x has no f16 CPU convolutions). Mixed precision refuses a low-precision type this
// says no to (--allow-emulation overrides: the reference loops then compute it, slowly).
bool cpu_runs_natively(graph::DataType t);

// A convolution (Conv, and ConvGrad of it) computes in its weight's dtype. Its activations --
// Conv's X, ConvGrad's dY and X -- have that dtype too, or are float32 with bf16 / f16 weights:
// passes::autocast casts only a convolution's weight and bias, and the kernel rounds float32
// activations to the weight's dtype as it reads them (no Cast node, no low-precision copy of X
// kept for backward) and accumulates in float32. Each output has its operand's dtype: Y and dX
// that of X, dW and dB that of W. Returns the compute dtype, or nullopt when the pair is neither
// (an unknown dtype, kUndefined, is taken as allowed).
inline std::optional<graph::DataType> conv_compute_dtype(graph::DataType x, graph::DataType w) {
  using graph::DataType;
  if (w == DataType::kUndefined) return x;
  if (x == w || x == DataType::kUndefined) return w;
  if (x == DataType::kFloat && (w == DataType::kBFloat16 || w == DataType::kFloat16)) return w;
  return std::nullopt;
}

}  // namespace onnxtrain::ops
