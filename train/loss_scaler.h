// Dynamic loss scaling for float16 mixed precision (--precision fp16), as torch's GradScaler and
// Keras' LossScaleOptimizer do it: the backward runs on the loss times `scale` so small
// gradients survive float16's range; a step whose gradients overflow is skipped by the graph
// (passes::attach_optimizer's guard) and halves the scale; `growth_interval` clean steps in a
// row double it. Scales stay powers of two when they start as one, so scaling is exact.
#pragma once

#include <cstdint>

namespace onnxtrain::train {

struct LossScalerOptions {
  double init = 65536;            // 2^16, torch's and Keras' start
  int64_t growth_interval = 2000;  // clean steps in a row before the scale doubles
};

struct LossScaler {
  // Below this the scale stops halving: float16 then overflows in the forward pass or the
  // gradients themselves exceed its range, and skipping steps cannot help (Trainer stops).
  static constexpr double kMinScale = 1.0;

  double scale = 0;             // 0: no loss scaling (float32, bf16)
  int64_t clean_steps = 0;      // finite steps since the last change of the scale
  int64_t skipped_in_row = 0;   // overflowed steps in a row (not checkpointed)

  // After a step: its gradients were finite, or not (the step was skipped).
  void update(bool finite, int64_t growth_interval) {
    if (scale <= 0) return;
    if (!finite) {
      scale /= 2;
      clean_steps = 0;
      ++skipped_in_row;
      return;
    }
    skipped_in_row = 0;
    if (++clean_steps >= growth_interval) {
      scale *= 2;
      clean_steps = 0;
    }
  }
};

}  // namespace onnxtrain::train
