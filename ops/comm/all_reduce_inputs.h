// The inputs of one ai.onnxtrain.AllReduce node as both its kernels (ops/comm CPU, ops/cuda NCCL)
// read them: the present input slots, their element count and their one dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/op_api.h"

namespace onnxtrain::ops {

struct AllReduceInputs {
  std::vector<int> slots;  // present inputs, in order (output i mirrors input i)
  int64_t total = 0;       // elements over all of them
  DataType dtype = DataType::kUndefined;
};

inline AllReduceInputs all_reduce_inputs(const KernelContext& ctx, const std::string& where) {
  AllReduceInputs r;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const TensorView* in = ctx.input(i);
    if (!in) continue;
    OT_CHECK(r.dtype == DataType::kUndefined || in->dtype == r.dtype, where,
             ": inputs of one AllReduce must share a dtype (", graph::dtype_short_name(r.dtype),
             " vs ", graph::dtype_short_name(in->dtype), " at input ", i, ")");
    r.dtype = in->dtype;
    r.slots.push_back(i);
    r.total += in->numel();
  }
  return r;
}

}  // namespace onnxtrain::ops
