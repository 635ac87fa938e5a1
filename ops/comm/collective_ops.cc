// The ops the replicate / bucket_allreduce passes insert: ai.onnxtrain.ShardBatch (splits the
// global batch across replicas; CPU kernel here) and ai.onnxtrain.AllReduce (its kernels, which
// call the step's collectives: ops/comm/collective_kernels.cc, ops/cuda/all_reduce.cu).
#include <algorithm>
#include <cstring>
#include <string>

#include "ops/comm/all_reduce_inputs.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::comm {

namespace {

int64_t replicas_of(const graph::Node& node) {
  const graph::Attribute* a = node.find_attr("replicas");
  OT_CHECK(a && a->type == graph::AttrType::kInt, node.describe(),
           ": attribute 'replicas' (int) is required");
  OT_CHECK(a->i() >= 1, node.describe(), ": replicas must be >= 1, got ", a->i());
  return a->i();
}

// Rows of replica k when n rows are split as evenly as possible over r replicas (the first
// n % r replicas get one more): [shard_start, shard_start + shard_size).
int64_t shard_size(int64_t n, int64_t r, int64_t k) {
  return n / r + (k < n % r ? 1 : 0);
}
int64_t shard_start(int64_t n, int64_t r, int64_t k) {
  return k * (n / r) + std::min(k, n % r);
}

// Output k's dim 0: exact when the batch is known, "<N>/r<k>" when it is the symbol N (each
// replica's count is its own unknown), unknown otherwise.
Dim shard_dim(const Dim& batch, int64_t r, int64_t k) {
  if (batch.is_known()) return Dim::known(shard_size(batch.value, r, k));
  if (!batch.param.empty()) return Dim::symbol(cat(batch.param, "/r", k));
  return Dim{};
}

void infer_shard_batch(InferenceContext& ctx) {
  const int64_t r = replicas_of(ctx.node);
  OT_CHECK(ctx.node.inputs().size() == 1, ctx.where(), ": expected 1 input, got ",
           ctx.node.inputs().size());
  OT_CHECK(static_cast<int64_t>(ctx.node.outputs().size()) == r, ctx.where(), ": expected ", r,
           " outputs (one per replica), got ", ctx.node.outputs().size());
  const ValueType& x = tensor_input(ctx, 0);
  OT_CHECK(!x.shape || !x.shape->empty(), ctx.where(),
           ": input 0 is a scalar; the batch is split along dim 0");
  for (int64_t k = 0; k < r; ++k) {
    std::optional<Shape> s = x.shape;
    if (s) (*s)[0] = shard_dim((*s)[0], r, k);
    set_output(ctx, static_cast<size_t>(k), x.dtype, std::move(s));
  }
}

// x: (N, ...) -> out_k: (size_k, ...), rows [start_k, start_k + size_k) of x
class ShardBatchKernel final : public Kernel {
 public:
  explicit ShardBatchKernel(const graph::Node& node) : node_(node), r_(replicas_of(node)) {}
  void run(KernelContext& ctx) override {
    const std::string where = node_.describe();
    const TensorView* x = ctx.input(0);
    OT_CHECK(x && x->rank() >= 1, where, ": input 0 must be a tensor of rank >= 1");
    OT_CHECK(ctx.num_outputs() == r_, where, ": expected ", r_, " outputs, got ",
             ctx.num_outputs());
    const shape::ElemKind e = shape::addressable_elem(x->dtype, where);
    const int64_t n = x->dims[0];
    const int64_t row = n > 0 ? x->numel() / n : 0;
    for (int64_t k = 0; k < r_; ++k) {
      if (!ctx.has_output(static_cast<int>(k))) continue;
      std::vector<int64_t> dims = x->dims;
      dims[0] = shard_size(n, r_, k);
      TensorView& out = ctx.output(static_cast<int>(k), dims);
      const int64_t count = dims[0] * row;
      if (count == 0) continue;
      const int64_t offset = shard_start(n, r_, k) * row;
      if (e.is_string) {
        const auto* src = static_cast<const std::string*>(shape::elems(*x)) + offset;
        auto* dst = static_cast<std::string*>(shape::out_elems(out));
        for (int64_t i = 0; i < count; ++i) dst[i] = src[i];
      } else {
        std::memcpy(out.data, shape::advance(x->data, e, offset),
                    static_cast<size_t>(count) * e.bytes);
      }
    }
  }

 private:
  const graph::Node& node_;
  int64_t r_;
};

// G of a node with replicas x G inputs and as many outputs, replica-major (AllReduce,
// Broadcast): slot k*G + i is tensor i of replica k.
size_t per_replica_slots(const InferenceContext& ctx, int64_t r) {
  const size_t n = ctx.node.inputs().size();
  OT_CHECK(n >= 1 && n == ctx.node.outputs().size() && n % static_cast<size_t>(r) == 0, ctx.where(),
           ": expected replicas x G inputs and as many outputs (replicas ", r, "), got ", n,
           " inputs and ", ctx.node.outputs().size(), " outputs");
  return n / static_cast<size_t>(r);
}

void infer_all_reduce(InferenceContext& ctx) {
  const int64_t r = replicas_of(ctx.node);
  const std::string reduction = ctx.node.attr_string("reduction", "sum");
  OT_CHECK(reduction == "sum" || reduction == "mean", ctx.where(),
           ": reduction must be \"sum\" or \"mean\", got \"", reduction, "\"");
  const graph::DataType wire = all_reduce_wire_attr(ctx.node);
  OT_CHECK(wire == graph::DataType::kUndefined || wire == graph::DataType::kBFloat16, ctx.where(),
           ": wire_dtype must be bfloat16 (16) or absent, got ", static_cast<int>(wire));
  // Inputs are replica-major: input k*G + i is tensor i of replica k. A replica's executor sees
  // only its own slots (the runtime omits the others), so absent slots are skipped.
  const size_t per_replica = per_replica_slots(ctx, r);
  const size_t n = per_replica * static_cast<size_t>(r);
  for (size_t i = 0; i < n; ++i) {
    if (!ctx.input_type(i)) continue;
    const ValueType& t = tensor_input(ctx, i);
    const ValueType* first_p = nullptr;
    for (size_t j = i % per_replica; j < n && !first_p; j += per_replica) first_p = ctx.input_type(j);
    const ValueType& first = *first_p;
    OT_CHECK(t.dtype == first.dtype, ctx.where(), ": input ", i, " is ",
             graph::dtype_short_name(t.dtype), " but replica 0's tensor ", i % per_replica, " is ",
             graph::dtype_short_name(first.dtype));
    OT_CHECK(wire == graph::DataType::kUndefined || t.dtype == graph::DataType::kFloat,
             ctx.where(), ": wire_dtype bfloat16 needs float32 inputs, input ", i, " is ",
             graph::dtype_short_name(t.dtype));
    propagate_type(ctx, i, i);
  }
}

// Broadcast (passes::shard_updates): replicas x G inputs and as many outputs, replica-major.
// The root's inputs are sent; its outputs are empty (it keeps what it sent). A receiving
// replica's input i is only read for its type (shard_updates passes the reduced gradient,
// keeping it alive until the step ends) and output i gets the root's tensor i.
void infer_broadcast(InferenceContext& ctx) {
  const int64_t r = replicas_of(ctx.node);
  const int64_t root = ctx.node.attr_int("root", -1);
  OT_CHECK(root >= 0 && root < r, ctx.where(), ": root must be in [0, ", r, "), got ", root);
  const size_t per_replica = per_replica_slots(ctx, r);
  const size_t n = per_replica * static_cast<size_t>(r);
  for (size_t i = 0; i < n; ++i) {
    const bool root_slot = i / per_replica == static_cast<size_t>(root);
    OT_CHECK(!root_slot || !ctx.node.output(i), ctx.where(), ": output ", i,
             " belongs to the root replica ", root, " and must be empty");
    if (!ctx.input_type(i)) continue;
    const ValueType& t = tensor_input(ctx, i);
    OT_CHECK(t.dtype != graph::DataType::kString, ctx.where(), ": input ", i,
             " is a string tensor");
    if (!root_slot) propagate_type(ctx, i, i);
  }
}

}  // namespace

ONNXTRAIN_REGISTER_OP(onnxtrain_shard_batch) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "ShardBatch";
  s.infer = infer_shard_batch;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<ShardBatchKernel>(n); };
  // The batch changes every step.
  s.foldable = false;
  return s;
}

ONNXTRAIN_REGISTER_OP(onnxtrain_all_reduce) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "AllReduce";
  s.infer = infer_all_reduce;
  // Kernels: ops/comm/collective_kernels.cc (CPU), ops/cuda/all_reduce.cu (NCCL).
  s.foldable = false;
  // The bucket is reduced where the gradients were written (the CPU kernel checks the layout);
  // a bfloat16 wire needs its own narrower buffer anyway.
  s.packed_inputs = [](const graph::Node& n) {
    return all_reduce_wire_attr(n) == graph::DataType::kUndefined;
  };
  return s;
}

ONNXTRAIN_REGISTER_OP(onnxtrain_broadcast) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "Broadcast";
  s.infer = infer_broadcast;
  // Kernel: ops/comm/collective_kernels.cc (CPU).
  s.foldable = false;
  return s;
}

}  // namespace onnxtrain::ops::comm
