// Mixed precision's facts about the kernels, in one place: which low-precision float types this
// machine's CPU kernels and a GPU's CUDA kernels run natively (what --precision /
// passes::autocast asks before it casts Conv/Gemm/MatMul down), and the dtype a convolution computes in when its operands differ
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

// The CUDA kernels (cuDNN / cuBLAS tensor cores, ops/cuda) on a GPU of compute capability
// cc_major.x: f32 always; f16 from 7.0 (Volta's tensor cores); bf16 from 8.0 (Ampere: bf16
// tensor cores; older GPUs have no bf16 arithmetic, cuDNN no bf16 convolutions).
inline bool cuda_runs_natively(graph::DataType t, int cc_major) {
  using graph::DataType;
  if (t == DataType::kFloat) return true;
  if (t == DataType::kFloat16) return cc_major >= 7;
  if (t == DataType::kBFloat16) return cc_major >= 8;
  return false;
}

// What cuda_runs_natively needs for t, for messages.
inline const char* cuda_native_requirement(graph::DataType t) {
  return t == graph::DataType::kBFloat16 ? "compute capability 8.0 (Ampere) or newer"
                                         : "compute capability 7.0 (Volta) or newer";
}

// A convolution (Conv, and ConvGrad of it) computes in the low precision of its operands: X
// (Conv's X, ConvGrad's dY and X) and W have one dtype, or one of them is bf16 / f16 and the
// other float32. The kernel rounds the float32 operand to the low dtype as it reads it (on
// oneDNN: in the reorder into the primitive's layout that it makes anyway) and accumulates in
// float32. Each output has its operand's dtype: Y and dX that of X, dW and dB that of W.
// passes::autocast gives a convolution bf16 activations around its float32 master weight: no
// weight copy and no Cast of the weight or its gradient (oneDNN writes float32 diff weights).
// A ConvGrad over a small map runs as GEMMs (ops/nn/conv_algorithm.h's
// conv_grad_gemm_preferred, e.g. ResNet-50's layer4 at 64x64): for bf16 on a CPU with bf16
// arithmetic as bf16 matmuls on W rounded to bf16 (nearest even) like the rest; otherwise (f16,
// or bf16 emulated) as float32 GEMMs that read the float32 weight as it is -- dX is then the
// float32 result rounded once.
// Returns the compute dtype, or nullopt when the pair is neither (an unknown dtype, kUndefined,
// is taken as allowed).
inline std::optional<graph::DataType> conv_compute_dtype(graph::DataType x, graph::DataType w) {
  using graph::DataType;
  auto low = [](DataType t) { return t == DataType::kBFloat16 || t == DataType::kFloat16; };
  if (w == DataType::kUndefined) return x;
  if (x == w || x == DataType::kUndefined) return w;
  if (x == DataType::kFloat && low(w)) return w;
  if (w == DataType::kFloat && low(x)) return x;
  return std::nullopt;
}

// ConvGrad's attribute `grad_dtype` (an ONNX dtype; default: W's): the dtype of dW and dB when
// it differs from W's. passes::keep_weight_copies hands ConvGrad the bf16 copy of a float32
// master weight (what it computes with anyway) and sets grad_dtype = float so dW and dB stay
// float32, as with the master itself -- except where the update reads dW in bf16 (no
// grad_dtype: dW in the copy's dtype, the float32 sum rounded once to nearest even).
inline constexpr const char* kGradDtypeAttr = "grad_dtype";

// The ai.onnxtrain optimizer updates' attribute `copy_dtype` (an ONNX dtype; bfloat16 only):
// the node also writes each updated float32 parameter rounded to it, nearest even -- the kept
// weight copy of passes::keep_weight_copies, made while the new weight is still in registers
// (a skipped step writes the old weight's copy). Adam, Momentum, Adagrad and AdamW append one
// such output per parameter group after their new states; SGD's is output 2 (after V_new,
// which may be empty).
inline constexpr const char* kCopyDtypeAttr = "copy_dtype";

}  // namespace onnxtrain::ops
