// A small deterministic random generator (SplitMix64) for the data pipeline: shuffles, holdout
// splits and synthetic data must be the same on every platform and standard library, which
// std::uniform_int_distribution does not promise.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace onnxtrain::runtime {

class DataRng {
 public:
  // `stream` separates independent uses of one user seed (epoch e, holdout, synthetic).
  DataRng(uint64_t seed, uint64_t stream) : state_(seed ^ (stream * 0xD1B54A32D192ED03ull)) {
    next();
  }
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n > 0, without modulo bias (rejection of the short last range).
  uint64_t below(uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v = next();
    while (v >= limit) v = next();
    return v % n;
  }
  // Uniform in [0, 1) with 24 random bits (exactly representable as float).
  float unit_float() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }

 private:
  uint64_t state_;
};

// Fisher-Yates over `v` driven by `rng`.
template <typename T>
void shuffle_with(std::vector<T>& v, DataRng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

// Stream ids: epoch e uses e itself; these sit far above any epoch count.
inline constexpr uint64_t kHoldoutStream = 0xF000000000000001ull;
inline constexpr uint64_t kSyntheticStream = 0xF000000000000002ull;

}  // namespace onnxtrain::runtime
