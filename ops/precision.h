// Which low-precision float types this machine's CPU kernels run natively: the one fact mixed
// precision (--precision, passes::autocast) asks before it casts Conv/Gemm/MatMul down.
#pragma once

#include "graph/dtype.h"

namespace onnxtrain::ops {

// f32 always; bf16 with AVX512-BF16 or AMX (oneDNN's effective ISA); f16 never with this
// oneDNN (v2.x has no f16 CPU convolutions). Mixed precision refuses a low-precision type this
// says no to (--allow-emulation overrides: the reference loops then compute it, slowly).
bool cpu_runs_natively(graph::DataType t);

}  // namespace onnxtrain::ops
