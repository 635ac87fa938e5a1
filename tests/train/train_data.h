// Random batches for the training tests: uniform float inputs and class labels from one seeded
// generator, so every test's data is reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "graph/tensor.h"

namespace onnxtrain::train_test {

// f32 tensor of `dims`, each element uniform in [lo, hi).
inline graph::Tensor uniform(std::vector<int64_t> dims, std::mt19937_64& rng, float lo = -1,
                             float hi = 1) {
  graph::Tensor t(graph::DataType::kFloat, std::move(dims));
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<float>()[i] = u(rng);
  return t;
}

// i64 labels [n], each in [0, classes).
inline graph::Tensor labels(int64_t n, int64_t classes, std::mt19937_64& rng) {
  graph::Tensor t(graph::DataType::kInt64, {n});
  for (int64_t i = 0; i < n; ++i)
    t.mutable_data_as<int64_t>()[i] = static_cast<int64_t>(rng() % static_cast<uint64_t>(classes));
  return t;
}

}  // namespace onnxtrain::train_test
