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
  // Where each present input sits in the block the CPU kernel reduces when the wire is the
  // inputs' own dtype (OpSchema::packed_inputs' layout: each one starts 64-byte aligned), and
  // the block's size. Every rank derives it from the dims, so the reduced counts match.
  std::vector<size_t> packed_offsets;
  size_t packed_bytes = 0;
  DataType dtype = DataType::kUndefined;
  // What the reduction travels and is summed in: `dtype`, or bfloat16 for float32 inputs of a
  // node with wire_dtype = bfloat16 (--reduce-precision bf16: half the bytes; each input is
  // rounded to nearest bf16, summed in float32, rounded again, widened back; graph/bfloat16.h).
  DataType wire = DataType::kUndefined;
};

// The node's `wire_dtype` attribute (ONNX TensorProto data type; absent or 0 = the inputs' own
// dtype): only bfloat16 is accepted, for float32 inputs.
inline DataType all_reduce_wire_attr(const graph::Node& n) {
  return static_cast<DataType>(n.attr_int("wire_dtype", 0));
}

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
    r.packed_offsets.push_back(r.packed_bytes);
    r.packed_bytes = r.packed_offsets.back() + packed_input_bytes(in->nbytes());
  }
  const DataType wire = all_reduce_wire_attr(ctx.node());
  OT_CHECK(wire == DataType::kUndefined ||
               (wire == DataType::kBFloat16 &&
                (r.dtype == DataType::kFloat || r.dtype == DataType::kUndefined)),
           where, ": wire_dtype ", graph::dtype_short_name(wire),
           " is not supported for ", graph::dtype_short_name(r.dtype),
           " inputs (bfloat16 for float32 only)");
  r.wire = wire == DataType::kUndefined ? r.dtype : wire;
  return r;
}

}  // namespace onnxtrain::ops
