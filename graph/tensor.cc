// Host tensor storage.
#include "graph/tensor.h"

#include <cstring>
#include <new>
#include <sstream>

#include "graph/bfloat16.h"
#include "graph/error.h"

namespace onnxtrain::graph {
namespace {

constexpr std::align_val_t kAlign{64};

std::shared_ptr<std::byte[]> allocate(size_t n) {
  if (n == 0) return nullptr;
  auto* p = static_cast<std::byte*>(::operator new[](n, kAlign));
  std::memset(p, 0, n);
  return std::shared_ptr<std::byte[]>(p, [](std::byte* q) { ::operator delete[](q, kAlign); });
}

template <typename T>
void append_values(std::ostringstream& os, const std::byte* p, int n) {
  for (int i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    if (i) os << ", ";
    if constexpr (sizeof(T) == 1)
      os << static_cast<int>(v);
    else
      os << v;
  }
}

}  // namespace

int64_t checked_element_count(std::span<const int64_t> dims, const std::string& what) {
  int64_t n = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    OT_CHECK(dims[i] >= 0, what, ": dim ", i, " is negative (", dims[i], ")");
    OT_CHECK(!__builtin_mul_overflow(n, dims[i], &n), what,
             ": element count overflows int64 at dim ", i);
  }
  return n;
}

Tensor::Tensor(DataType dtype, std::vector<int64_t> dims) : dtype_(dtype), dims_(std::move(dims)) {
  numel_ = checked_element_count(dims_, "tensor");
  if (dtype_ == DataType::kString) {
    strings_.resize(static_cast<size_t>(numel_));
    return;
  }
  auto bytes = dtype_storage_bytes(dtype_, numel_);
  OT_CHECK(bytes.has_value(), "tensor: byte size overflows int64");
  nbytes_ = static_cast<size_t>(*bytes);
  data_ = allocate(nbytes_);
}

std::byte* Tensor::mutable_data() {
  if (data_ && data_.use_count() > 1) {
    auto fresh = allocate(nbytes_);
    std::memcpy(fresh.get(), data_.get(), nbytes_);
    data_ = std::move(fresh);
  }
  return data_.get();
}

bool Tensor::equals(const Tensor& o) const {
  if (dtype_ != o.dtype_ || dims_ != o.dims_) return false;
  if (dtype_ == DataType::kString) return strings_ == o.strings_;
  if (nbytes_ != o.nbytes_) return false;
  return nbytes_ == 0 || data_ == o.data_ || std::memcmp(data_.get(), o.data_.get(), nbytes_) == 0;
}

std::string Tensor::preview(int n) const {
  std::ostringstream os;
  int count = static_cast<int>(std::min<int64_t>(n, numel_));
  const std::byte* p = data_.get();
  switch (dtype_) {
    case DataType::kFloat: append_values<float>(os, p, count); break;
    case DataType::kDouble: append_values<double>(os, p, count); break;
    case DataType::kInt64: append_values<int64_t>(os, p, count); break;
    case DataType::kInt32: append_values<int32_t>(os, p, count); break;
    case DataType::kInt16: append_values<int16_t>(os, p, count); break;
    case DataType::kInt8: append_values<int8_t>(os, p, count); break;
    case DataType::kUInt8:
    case DataType::kBool: append_values<uint8_t>(os, p, count); break;
    case DataType::kUInt16: append_values<uint16_t>(os, p, count); break;
    case DataType::kUInt32: append_values<uint32_t>(os, p, count); break;
    case DataType::kUInt64: append_values<uint64_t>(os, p, count); break;
    case DataType::kString:
      for (int i = 0; i < count; ++i) os << (i ? ", \"" : "\"") << strings_[i] << '"';
      break;
    default:
      os << "<" << nbytes_ << " bytes of " << dtype_short_name(dtype_) << ">";
      return os.str();
  }
  if (numel_ > count) os << (count ? ", ..." : "...");
  return os.str();
}

Tensor bf16_nearest(const Tensor& f32) {
  OT_CHECK(f32.dtype() == DataType::kFloat, "bf16_nearest: a float32 tensor is needed, got ",
           dtype_short_name(f32.dtype()));
  Tensor out(DataType::kBFloat16, f32.dims());
  const float* in = f32.data_as<float>();
  auto* bits = out.mutable_data_as<uint16_t>();
  for (int64_t i = 0; i < f32.numel(); ++i) bits[i] = bf16_from_float(in[i]);
  return out;
}

}  // namespace onnxtrain::graph
