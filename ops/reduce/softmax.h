// Numerically stable softmax / log-softmax along lanes (max subtracted, sums in double): used by
// the Softmax and LogSoftmax ops and by SoftmaxCrossEntropyLoss.
#pragma once

#include "ops/reduce/reduce_engine.h"

namespace onnxtrain::ops::reduce {

// x, y: lanes [outer, n, inner]; softmax (or log-softmax when `log`) along n. y may alias x.
template <typename T>
void softmax_lanes(const Lanes& l, const T* x, T* y, bool log, const KernelContext& ctx);

extern template void softmax_lanes<float>(const Lanes&, const float*, float*, bool,
                                          const KernelContext&);
extern template void softmax_lanes<double>(const Lanes&, const double*, double*, bool,
                                           const KernelContext&);

}  // namespace onnxtrain::ops::reduce
