// Learning-rate schedules: the value the trainer feeds to the training graph's `lr` input at
// each step, and the parser for the CLI's --lr-schedule spec.
#pragma once

#include <cstdint>
#include <string>

namespace onnxtrain::runtime {

// All counts (warmup_steps, step_size, total_steps) are in the unit of the `step` passed to
// lr_at: optimizer steps in the C++ API; a caller that thinks in epochs converts first.
struct LrSchedule {
  enum class Kind { kConstant, kStep, kCosine };
  Kind kind = Kind::kConstant;
  float base_lr = 0.001f;
  // Linear warmup: step s < warmup_steps runs at base_lr * (s + 1) / warmup_steps; the main
  // schedule then starts from its own step 0 at s = warmup_steps.
  int64_t warmup_steps = 0;
  // kStep: base_lr * gamma^floor(s / step_size).
  int64_t step_size = 0;
  float gamma = 0.1f;
  // kCosine: min_lr + (base_lr - min_lr) (1 + cos(pi p)) / 2, p = s / (total_steps -
  // warmup_steps) clamped to [0, 1]. total_steps counts warmup too; 0 = not yet known (the
  // trainer sets it from epochs x steps per epoch before the first lr_at).
  int64_t total_steps = 0;
  float min_lr = 0.0f;
};

// Learning rate of 0-based step `step` (step < 0 is an error). Throws onnxtrain::Error for a
// cosine schedule whose total_steps is unset or not past the warmup.
float lr_at(const LrSchedule& s, int64_t step);

// Spec syntax: an optional warmup, then at most one decay, separated by a comma:
//   spec     := [warmup ","] decay | warmup
//   warmup   := "warmup:" N                   N >= 1 linear warmup steps
//   decay    := "constant"
//             | "step:" SIZE [":" GAMMA]      x GAMMA (default 0.1) every SIZE >= 1 steps
//             | "cosine" [":" TOTAL [":" MIN_LR]]   TOTAL steps including warmup (0 = set
//                                             later by the trainer), MIN_LR default 0
// Examples: "constant", "step:30:0.1", "cosine", "cosine:10000:1e-5", "warmup:500,cosine",
// "warmup:100" (warmup then constant). Whitespace is not allowed. Throws onnxtrain::Error
// quoting the spec and the offending part.
LrSchedule parse_lr_schedule(const std::string& spec, float base_lr);

}  // namespace onnxtrain::runtime
