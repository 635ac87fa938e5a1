// The one place that fixes the order of the training passes (passes.h), with the verifier
// between stages so a broken rewrite is caught at the pass that made it.
#include "graph/error.h"
#include "graph/verifier.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

TrainingGraphInfo build_training_graph(graph::Model& model, const TrainingOptions& opts) {
  TrainingGraphInfo info;
  auto stage = [&](const char* name) {
    graph::verify_graph(*model.graph, onnxtrain::cat("after ", name));
    graph::verify_training(model, onnxtrain::cat("after ", name));
  };
  lower_sequences(model, /*require_all=*/true);
  stage("lower_sequences");
  infer_shapes(model);
  info.prepared = prepare_training(model, opts.trainable, opts.output);
  stage("prepare_training");
  if (opts.precision != graph::DataType::kFloat) {
    info.autocast = autocast(model, opts.precision, info.prepared.params);
    infer_shapes(model);
    stage("autocast");
  }
  info.loss = attach_loss(model, info.prepared.logits, loss_options(opts, opts.loss));
  infer_shapes(model);
  stage("attach_loss");
  info.gradients = autodiff(model, info.loss.loss, info.prepared.params);
  // The gradient values' shapes (some follow only from Shape -> Expand chains): the rewrites
  // below match on static shapes.
  infer_shapes(model);
  stage("autodiff");
  info.conv_algorithm = select_conv_algorithm(model, opts.conv_algorithm);
  stage("select_conv_algorithm");
  // replicate's sync_batchnorm rewrites plain BatchNormalization(Grad) nodes only.
  if (opts.fuse_batchnorm_relu && !opts.sync_batchnorm) {
    info.batchnorm_relu = fuse_batchnorm_relu(model);
    stage("fuse_batchnorm_relu");
  }
  if (opts.fold_transposes) {
    info.transposes = fold_transposes(model);
    infer_shapes(model);
    stage("fold_transposes");
  }
  if (opts.keep_lstm_traces) {
    info.lstm_traces = keep_lstm_traces(model);
    infer_shapes(model);
    stage("keep_lstm_traces");
  }
  // float16's narrow range needs dynamic loss scaling; bfloat16 has float32's exponent range.
  OptimizerOptions optimizer = opts.optimizer;
  optimizer.loss_scaling = optimizer.loss_scaling || opts.precision == graph::DataType::kFloat16;
  info.optimizer = attach_optimizer(model, info.prepared.params, optimizer);
  infer_shapes(model);
  stage("attach_optimizer");
  if (opts.keep_weight_copies && opts.precision == graph::DataType::kBFloat16) {
    // Replicated graphs AllReduce float32 gradients (bucket_allreduce): they keep the Casts.
    info.weight_copies = keep_weight_copies(
        model, /*bf16_gradients=*/opts.bf16_gradients && opts.replicas == 1 && !opts.collectives);
    infer_shapes(model);
    stage("keep_weight_copies");
  }
  dce(model);
  stage("dce");
  if (opts.block_layout && !opts.sync_batchnorm) {
    info.block_layout = block_layout(model);
    stage("block_layout");
  }
  if (opts.replicas > 1 || opts.collectives) {
    replicate(model, {.replicas = opts.replicas,
                      .devices = opts.devices,
                      .sync_batchnorm = opts.sync_batchnorm,
                      .force = opts.collectives});
    stage("replicate");
    info.buckets = bucket_allreduce(model, {.bucket_mb = opts.bucket_mb, .wire_dtype = opts.reduce_dtype});
    stage("bucket_allreduce");
    dce(model);
    stage("dce after bucket_allreduce");
    if (opts.shard_updates && !opts.collectives) {
      info.sharded = shard_updates(model);
      stage("shard_updates");
    }
  }
  if (opts.schedule_updates) {
    info.schedule = schedule_updates(model);
    stage("schedule_updates");
  }
  return info;
}

}  // namespace onnxtrain::passes
