// Schemas of the cross-replica BatchNormalization pair that `--sync-batchnorm` puts in a
// replicated graph: the statistics are those of the GLOBAL batch (all replicas). Their CPU
// kernels (ops/comm/collective_kernels.cc) reach the other replicas through
// KernelContext::collectives().
#include "ops/shape_util.h"

namespace onnxtrain::ops::nn {
namespace {

// ai.onnxtrain.SyncBatchNormalization(X, scale, B, running_mean, running_var)
//   -> (Y, running_mean', running_var'): BatchNormalization in training mode (opset 15
//   semantics, attributes epsilon, momentum) over the union of every replica's batch.
void infer_sync_bn(InferenceContext& ctx) {
  propagate_type(ctx);
  for (size_t i = 1; i < ctx.output_types.size(); ++i) {
    const ValueType& stat = tensor_input(ctx, 3);
    set_output(ctx, i, stat.dtype, stat.shape);
  }
}

// ai.onnxtrain.SyncBatchNormalizationGrad(dY, X, scale) -> (dX, dScale, dB): dX from the global
// batch statistics and the global sums of dY and dY*xhat; dScale and dB are this replica's
// share (the gradient AllReduce sums them).
void infer_sync_bn_grad(InferenceContext& ctx) {
  propagate_type(ctx, 0, 1);
  for (size_t i = 1; i < ctx.output_types.size(); ++i) {
    const ValueType& scale = tensor_input(ctx, 2);
    set_output(ctx, i, scale.dtype, scale.shape);
  }
}

OpSchema collective_schema(const char* op, InferFn infer) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = op;
  s.infer = std::move(infer);
  s.foldable = false;
  return s;
}

}  // namespace

ONNXTRAIN_REGISTER_OP(nn_sync_batch_norm) {
  return collective_schema("SyncBatchNormalization", infer_sync_bn);
}
ONNXTRAIN_REGISTER_OP(nn_sync_batch_norm_grad) {
  return collective_schema("SyncBatchNormalizationGrad", infer_sync_bn_grad);
}

}  // namespace onnxtrain::ops::nn
