// Host tensor: dtype + dims + a 64-byte aligned byte buffer (or strings). Copies share the
// buffer; mutable_data() un-shares it first, so a cloned graph never aliases writes.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/dtype.h"

namespace onnxtrain::graph {

// Product of dims; throws Error on a negative dim or int64 overflow.
int64_t checked_element_count(std::span<const int64_t> dims, const std::string& what);

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled tensor. Throws on negative dims / overflow.
  Tensor(DataType dtype, std::vector<int64_t> dims);

  template <typename T>
  static Tensor from_vector(DataType dtype, std::vector<int64_t> dims, const std::vector<T>& v) {
    Tensor t(dtype, std::move(dims));
    size_t n = std::min(t.nbytes(), v.size() * sizeof(T));
    if (n) std::memcpy(t.mutable_data(), v.data(), n);
    return t;
  }

  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t rank() const { return static_cast<int64_t>(dims_.size()); }
  int64_t numel() const { return numel_; }
  // Storage bytes (packed for 4-bit types; 0 for strings).
  size_t nbytes() const { return nbytes_; }

  const std::byte* data() const { return data_.get(); }
  std::byte* mutable_data();
  template <typename T>
  const T* data_as() const {
    return reinterpret_cast<const T*>(data_.get());
  }
  template <typename T>
  T* mutable_data_as() {
    return reinterpret_cast<T*>(mutable_data());
  }

  const std::vector<std::string>& strings() const { return strings_; }
  std::vector<std::string>& mutable_strings() { return strings_; }

  // Same dtype, dims and bytes (or strings).
  bool equals(const Tensor& other) const;
  // First `n` values formatted for humans ("0.1, -0.2, ...").
  std::string preview(int n) const;

 private:
  DataType dtype_ = DataType::kUndefined;
  std::vector<int64_t> dims_;
  int64_t numel_ = 0;
  size_t nbytes_ = 0;
  std::shared_ptr<std::byte[]> data_;
  std::vector<std::string> strings_;
};

// A float32 tensor's values rounded to bfloat16, nearest even (graph/bfloat16.h): mixed
// precision's kept weight copies (passes::keep_weight_copies, TrainingSession::set_state).
Tensor bf16_nearest(const Tensor& f32);

}  // namespace onnxtrain::graph
