// Layout computation of the broadcasting engine (the loops themselves are templates in
// broadcast.h).
#include "ops/elementwise/broadcast.h"

#include "ops/shape_util.h"

namespace onnxtrain::ops::ew {

BroadcastLayout make_layout(std::span<const int64_t> out_dims,
                            std::span<const std::span<const int64_t>> operand_dims,
                            const std::string& where) {
  BroadcastLayout layout;
  const size_t rank = out_dims.size();
  const size_t n = operand_dims.size();
  OT_CHECK(n >= 1 && n <= static_cast<size_t>(kMaxOperands), where, ": ", n,
           " operands exceed the engine's limit");
  layout.num_operands = static_cast<int>(n);
  // aligned[k][d]: operand k's size in output dim d (1 where it has fewer dims).
  std::array<std::vector<int64_t>, kMaxOperands> aligned;
  for (size_t k = 0; k < n; ++k) {
    std::span<const int64_t> in = operand_dims[k];
    OT_CHECK(in.size() <= rank, where, ": operand ", k, " has rank ", in.size(),
             " but the output has rank ", rank);
    aligned[k].assign(rank - in.size(), 1);
    aligned[k].insert(aligned[k].end(), in.begin(), in.end());
    for (size_t d = 0; d < rank; ++d)
      OT_CHECK(aligned[k][d] == out_dims[d] || aligned[k][d] == 1, where, ": operand ", k, " dim ",
               d, " of size ", aligned[k][d], " does not broadcast to ", out_dims[d]);
  }
  layout.total = numel(out_dims);
  if (layout.total == 0) return layout;

  // Keep the dims of size > 1; merge neighbours whose broadcast pattern is the same for every
  // operand (both advance or both stay), so contiguous runs become one long dim.
  std::vector<std::array<bool, kMaxOperands>> bcast;
  for (size_t d = 0; d < rank; ++d) {
    if (out_dims[d] == 1) continue;
    std::array<bool, kMaxOperands> b{};
    for (size_t k = 0; k < n; ++k) b[k] = aligned[k][d] == 1;
    if (!bcast.empty() && bcast.back() == b) {
      layout.dims.back() *= out_dims[d];
    } else {
      layout.dims.push_back(out_dims[d]);
      bcast.push_back(b);
    }
  }
  if (layout.dims.empty()) {  // a single element
    layout.dims.push_back(1);
    bcast.push_back({});
  }
  for (size_t k = 0; k < n; ++k) {
    std::vector<int64_t>& s = layout.strides[k];
    s.assign(layout.dims.size(), 0);
    int64_t running = 1;
    for (size_t d = layout.dims.size(); d-- > 0;) {
      if (bcast[d][k]) continue;
      s[d] = running;
      running *= layout.dims[d];
    }
    layout.inner_contiguous[k] = s.back() == 1;
  }
  return layout;
}

std::vector<int64_t> broadcast_all(std::span<const std::span<const int64_t>> operand_dims,
                                   const std::string& where) {
  std::vector<int64_t> out;
  for (std::span<const int64_t> d : operand_dims) out = broadcast_dims(out, d, where);
  return out;
}

}  // namespace onnxtrain::ops::ew
