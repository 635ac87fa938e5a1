// The optional trailing `apply` input of the ai.onnxtrain optimizer updates (fp16 dynamic loss
// scaling, issue #19): a bool scalar; when false the step is skipped and every output equals its
// input. Shared by the CPU kernels in ops/optim/optimizers.cc and ops/optim/sgd.cc.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "ops/shape_util.h"

namespace onnxtrain::ops::optim {

// Plan-time check of the guard's type: bool, one element when its dims are known.
inline void check_guard_type(const ValueType& t, const std::string& where) {
  OT_CHECK(t.dtype == DataType::kBool, where, ": the guard input 'apply' must be bool, got ",
           graph::dtype_short_name(t.dtype));
  if (auto d = known_dims(t))
    OT_CHECK(numel(*d) == 1, where, ": the guard input 'apply' must be a scalar, got ", numel(*d),
             " elements");
}

// The step's decision: true when the guard is absent (nullptr: no slot or an omitted input).
inline bool guard_allows(const TensorView* apply, const std::string& where) {
  if (!apply) return true;
  OT_CHECK(apply->dtype == DataType::kBool, where, ": the guard input 'apply' must be bool, got ",
           graph::dtype_short_name(apply->dtype));
  OT_CHECK(apply->numel() == 1, where, ": the guard input 'apply' must be a scalar, got ",
           apply->numel(), " elements");
  return *apply->as<bool>();
}

// A skipped step's output: the input itself. Nothing is written when the runtime gave the output
// the input's buffer (in-place training state), so a skipped step costs no memory traffic.
inline void copy_through(const TensorView& in, const TensorView* out, const KernelContext& ctx) {
  if (!out || out->data == in.data) return;
  constexpr int64_t kChunk = int64_t{1} << 18;  // bytes per parallel copy
  const auto bytes = static_cast<int64_t>(in.nbytes());
  const auto* src = static_cast<const std::byte*>(in.data);
  auto* dst = static_cast<std::byte*>(out->data);
  ctx.parallel_for((bytes + kChunk - 1) / kChunk, 1, [&](int64_t begin, int64_t end) {
    const int64_t lo = begin * kChunk, hi = std::min(bytes, end * kChunk);
    std::memcpy(dst + lo, src + lo, static_cast<size_t>(hi - lo));
  });
}

}  // namespace onnxtrain::ops::optim
