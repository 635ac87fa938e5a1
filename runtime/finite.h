// Where a tensor holds a non-finite value (NaN, +-Inf): the one check behind the trainer's
// non-finite guard (a step's loss, the state before a checkpoint or model is written, the
// values of a diagnosis run) and the data loaders' check of float features (issue #17).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "graph/tensor.h"

namespace onnxtrain::runtime {

struct NonFiniteAt {
  int64_t index = 0;  // flat element index
  double value = 0;   // NaN or +-Inf
};

// The first non-finite element of a float32/float64 tensor; nullopt for a finite one and for
// every other dtype (integers are always finite; f16/bf16 state is not trained here).
inline std::optional<NonFiniteAt> find_nonfinite(const graph::Tensor& t) {
  auto scan = [&](const auto* p) -> std::optional<NonFiniteAt> {
    for (int64_t i = 0, n = t.numel(); i < n; ++i)
      if (!std::isfinite(p[i])) return NonFiniteAt{i, static_cast<double>(p[i])};
    return std::nullopt;
  };
  if (t.dtype() == graph::DataType::kFloat) return scan(t.data_as<float>());
  if (t.dtype() == graph::DataType::kDouble) return scan(t.data_as<double>());
  return std::nullopt;
}

// "nan", "inf", "-inf".
inline std::string nonfinite_text(double v) {
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}

}  // namespace onnxtrain::runtime
