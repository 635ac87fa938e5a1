// ai.onnxtrain.SGD's per-element update, shared by the CPU kernel (ops/optim/sgd.cc) and the CUDA
// kernel (ops/cuda/optim.cu), so both devices apply one formula. Header-only.
#pragma once

#include <cstdint>

#include "ops/host_device.h"

namespace onnxtrain::ops {

struct SgdAttrs {
  double momentum = 0, weight_decay = 0;
  bool nesterov = false;
};

// Element k, in double: g' = g + weight_decay x; v = momentum v + g' (when V is given);
// x -= lr * (g' | v | g' + momentum v). x_new / v_new may alias x / v (element k is read first).
template <typename T>
OT_HOST_DEVICE inline void sgd_update(const SgdAttrs& a, double lr, int64_t k, const T* x,
                                      const T* g, const T* v, T* x_new, T* v_new) {
  const double xk = static_cast<double>(x[k]);
  const double gr = static_cast<double>(g[k]) + a.weight_decay * xk;
  double step = gr;
  if (v) {
    const double vk = a.momentum * static_cast<double>(v[k]) + gr;
    if (v_new) v_new[k] = static_cast<T>(vk);
    step = a.nesterov ? gr + a.momentum * vk : vk;
  }
  x_new[k] = static_cast<T>(xk - lr * step);
}

}  // namespace onnxtrain::ops
