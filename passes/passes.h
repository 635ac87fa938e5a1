// Graph -> graph rewrites that turn an inference model into a training graph. One pass per
// file (passes/<name>.cc), one entry point each, declared here; passes/pipeline.cc is the only
// place that fixes their order. Passes never call the runtime.
//
// What the values of a training graph mean is the model's training signature
// (graph/training_signature.h, Model::training): each pass records the inputs, results, state,
// gradients, replicas and buckets it creates, and reads what earlier passes recorded. The names
// the passes give are for people only: the batch's labels `labels` (cross-entropy) or
// `targets` (MSE), the scalar feeds `loss_scale` and `lr`, the results `loss` and `correct`,
// `<S>.updated` for the new value of state S, `<w>_grad` for dLoss/dw, `/r<k>` for replica k's
// copy. Nothing downstream parses them. onnxtrain's own ops use domain ai.onnxtrain.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/tensor.h"

namespace onnxtrain::passes {

// ---- infer_shapes.cc
// Static type/shape inference over the main graph in topological order with the op registry
// (symbolic dims stay unknown). Fills Value::type where it was unset or less precise; throws
// on an op the registry lacks or an inconsistent graph, naming the node.
void infer_shapes(graph::Model& model);
// The per-node step of infer_shapes, for passes that add nodes one at a time: fills the types
// of n's outputs and records small constant results (shape vectors) in `known`.
using ConstantValues = std::map<const graph::Value*, graph::Tensor>;
// Int vectors of shape subgraphs with symbolic elements (ops::InferenceContext::
// input_dim_values), e.g. [batch, 16, 96]: given, infer_node reads and extends it too.
using DimValues = std::map<const graph::Value*, graph::Shape>;
void infer_node(const graph::Model& model, graph::Node& n, ConstantValues& known,
                DimValues* dims = nullptr);
// Initializers that are not graph inputs (their values cannot change), typing them on the way.
ConstantValues constant_initializers(graph::Graph& g);

// ---- lower_sequences.cc
struct SequenceLowering {
  int lowered = 0;                     // sequence-op nodes rewritten
  std::vector<std::string> unlowered;  // one line per sequence-op node that stays: node and why
};
// Rewrites ONNX sequence ops whose structure is static (ops/sequence/static_sequences.h) into the
// tensors the sequences hold: SplitToSequence -> Split (+ Squeeze per piece), SequenceConstruct /
// Empty / Insert / Erase -> a list known at compile time, SequenceAt -> the piece, SequenceLength ->
// a Constant, ConcatFromSequence -> (Unsqueeze +) Concat; outputs keep their names. The rest stays
// (a sequence that is a graph input or output or reaches Loop/If/Scan, a position or split that
// is not constant, a piece count no shape tells) and is listed; `require_all` throws one line
// naming every such node instead. No sequence op: nothing happens (not even shape inference).
SequenceLowering lower_sequences(graph::Model& model, bool require_all = false);

// ---- prepare_training.cc
struct TrainableOptions {
  std::string freeze_regex;     // parameters whose name matches are not trained
  std::string trainable_regex;  // when set, only matching parameters are trained
  // true (--bn-mode frozen): BatchNormalization keeps its inference form, normalizing with the
  // running statistics and leaving them as they are (torch's BN in eval()); its scale and bias
  // still train unless frozen by name. false: batch statistics, running statistics updated.
  bool freeze_batch_norm = false;
  // untie_initializers(untie = true) runs on the inference model first (--untie-initializers).
  bool untie_initializers = false;
};
struct PreparedModel {
  std::vector<std::string> params;  // trainable initializers, graph order
  std::vector<std::string> bn_running_stats;  // BN running mean/var initializers (state)
  std::string logits;               // the output the loss attaches to (pre-softmax if any)
  // One line per running statistic given its own copy (exporters merge equal initializers).
  std::vector<std::string> untied;
  // Float initializers on a path to the output that the exporter marked as no parameter of the
  // module (torch.export's buffers and constants, e.g. a rotary embedding's inv_freq): fixed, as
  // torch keeps them, and named in the training plan. --trainable cannot pick them.
  std::vector<std::string> buffers;
};
// Picks the trainable parameters (float initializers on a differentiable path to the trained
// output, never BN running statistics, shape constants or what the exporter marked as buffers:
// torch's dynamo exporter writes each initializer's torch.export input kind into its value
// metadata, and only PARAMETER ones train where it did), switches BatchNormalization and
// Dropout to training mode (running statistics wired back through `<stat>.updated` outputs).
// A running statistic that other nodes share (an exporter merged equal initializers) or that a
// Constant node gives is first copied into an initializer of that BN's own (`untied`).
// `output` names the model output to train ("" = the only/first float output); when it is a
// Softmax over the class axis (possibly behind Identity), `logits` is the Softmax's input.
// Expects typed values (infer_shapes first). The regexes are ECMAScript, matched anywhere in
// the name (std::regex_search); trainable_regex applies first, then freeze_regex, and one that
// matches no candidate is an error. Dropout before opset 12 stays the identity the runtime
// runs it as (those opsets have no training switch).
PreparedModel prepare_training(graph::Model& model, const TrainableOptions& opts,
                               const std::string& output = "");

// Exporters merge initializers with equal values (eval-mode torch.onnx.export: BERT's zero
// biases become one tensor, LayerNorm weights likewise). A float initializer of rank >= 1 read
// at the same input slot of several nodes of one op type (several Adds' bias, several
// LayerNormalizations' scale) is such a merge: those nodes normally own separate parameters.
// (One tensor read by different ops, e.g. an embedding table Gather-ed and MatMul-ed, is a
// deliberate tie and is left alone; so are pieces of one tensor read by several Slice, Split
// or Gather nodes, as torch's dynamo exporter slices an LSTM's weights into their gates.)
// Running statistics shared by BatchNormalizations are always given their own copies
// (untie_running_statistics). With `untie`, every merged parameter is copied per consumer as
// well: the first keeps the name, the others get "<name>.<k>"; the copies train on their own
// and are written to the trained model.
struct UntieReport {
  std::vector<std::string> tied;    // one line per merged parameter left shared (a warning)
  std::vector<std::string> copied;  // one line per copy made
};
UntieReport untie_initializers(graph::Model& model, bool untie);

// ---- attach_loss.cc
// kOutput: the trained output is itself the loss (a float scalar the model computes, e.g. an
// export with labels as an input): loss = output x loss_scale, no labels, targets or correct.
enum class LossKind { kAuto, kCrossEntropy, kMse, kOutput };
struct LossInfo {
  LossKind kind = LossKind::kCrossEntropy;  // resolved (never kAuto)
  std::string loss = "loss";
  std::string correct;  // "correct" for cross-entropy, "" for MSE
};
struct LossOptions {
  LossKind kind = LossKind::kAuto;
  // Cross-entropy: the logits' class axis. 1 is torch's layout, logits (N, C, d1..dk) with
  // labels (N, d1..dk); -1 puts the classes last, as language-model heads give them: logits
  // (N, T, C) with per-token labels (N, T). They differ only for rank >= 3.
  int64_t class_axis = 1;
  // Cross-entropy: labels equal to this (padding; torch's default is -100) contribute nothing
  // to the loss nor to `correct`. Recorded on the labels input of the training signature, so
  // the loss_scale feed counts only the other labels. nullopt: every label must be a class.
  std::optional<int64_t> ignore_index;
  // What the data's labels are, when known: true = integer class labels, false = float
  // targets. Decides kAuto before the output's shape does.
  std::optional<bool> integer_labels = std::nullopt;
};
// Adds the loss on `logits` (PreparedModel::logits): SoftmaxCrossEntropyLoss(sum) with int64
// `labels`, or MSE with `targets`; both x `loss_scale`. kAuto: cross-entropy for integer labels
// (LossOptions::integer_labels) on a float output of rank >= 2 whose class dim is not a known
// 1, MSE for float targets; without that hint, cross-entropy when the output is (N, classes,
// ...) with a known classes > 1 (along class_axis) and a float dtype, MSE otherwise. kOutput:
// the trained output is the loss (TrainingSignature::model_loss). Before opset 12
// cross-entropy is composed of ops of the model's own opset (LogSoftmax, Equal, ReduceSum; the class count must be known, an ignore_index negative); the
// opset import is never changed. Existing values named labels / targets / loss_scale / loss /
// correct are an error (the names are the contract).
LossInfo attach_loss(graph::Model& model, const std::string& logits, const LossOptions& opts);
inline LossInfo attach_loss(graph::Model& model, const std::string& logits, LossKind kind) {
  LossOptions opts;
  opts.kind = kind;
  return attach_loss(model, logits, opts);
}

// ---- autocast.cc
struct AutocastInfo {
  int low_nodes = 0;     // Conv / Gemm / MatMul nodes now computing in the low precision
  int follow_nodes = 0;  // BN / Relu / Add / Sum / pooling nodes now writing it
  int casts = 0;         // Cast nodes added (weights, graph inputs, float32 readers' copies)
};
// Mixed precision on the forward graph (after prepare_training, before attach_loss, so autodiff
// differentiates through the casts), torch.autocast's op classes:
//  - every Gemm and MatMul reads low-precision (`compute`: bf16 or f16) copies of its float32
//    inputs -- one Cast per source value, `<name>.bf16`; a parameter's is its low-precision
//    weight copy, recorded in TrainingSignature::copies -- and every Conv one of its X, keeping
//    its float32 weight and bias (ops/precision.h's conv_compute_dtype: it computes in X's
//    dtype and writes dW and dB in float32); each writes a low-precision output, renamed
//    `<name>.bf16`. An ai.onnxtrain.FusedConv (onnxrun runs optimize_inference first where the
//    CPU has the precision natively) is lowered like a Conv, its residual Z read in bf16 too;
//  - BatchNormalization, Relu, Add, Sum, MaxPool and AveragePool whose activation inputs are all
//    low-precision write a low-precision output too (their kernels compute in float32 and store
//    bf16; BN's parameters and statistics stay float32), so a ResNet's activations stay bf16
//    from the first convolution to the global pooling;
//  - every other reader of a low-precision value reads a float32 Cast of it, named as the value
//    was before autocast (the loss attaches to it, the graph may output it).
// The master weights, the loss, softmax, reductions and the optimizer stay float32. Sets
// TrainingSignature::compute_dtype when any node changed. `params`: the trained parameters
// (PreparedModel::params).
AutocastInfo autocast(graph::Model& model, graph::DataType compute,
                      const std::vector<std::string>& params);

// ---- autodiff.cc
struct GradientInfo {
  std::map<std::string, std::string> grads;  // value name -> its gradient value (`<name>_grad`)
  int backward_nodes = 0;
};
// Reverse mode from scalar `loss` w.r.t. `wrt` (any float values: initializers, graph inputs).
// Before rewriting anything, collects every op on a path from `wrt` to `loss` without a
// gradient rule and throws one error naming them all. Values in `wrt` that do not reach the
// loss get a zero gradient (and are reported by name in GradientInfo only through that).
GradientInfo autodiff(graph::Model& model, const std::string& loss,
                      const std::vector<std::string>& wrt);

// ---- attach_optimizer.cc
enum class OptimizerKind { kSgd, kMomentum, kAdam, kAdamW, kAdagrad };
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdam;
  float momentum = 0.9f;      // kMomentum (and kSgd when > 0 is requested explicitly)
  bool nesterov = false;
  float weight_decay = 0.0f;  // L2 for SGD/momentum/Adam/Adagrad, decoupled for AdamW
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-7f;  // Keras' Adam epsilon
  float clip_global_norm = 0.0f;  // > 0: scale all gradients so their global L2 norm <= this
  // Dynamic loss scaling (fp16 mixed precision): the gradients arrive multiplied by the loss
  // scale S; ai.onnxtrain.UnscaleGradients(grad_unscale = 1/S, grads...) multiplies them back
  // and yields `grads_finite`, which guards every update (and the step count): a step whose
  // gradients overflowed changes no state. Inputs/results recorded as kGradUnscale /
  // kGradsFinite in the training signature.
  bool loss_scaling = false;
};
struct OptimizerInfo {
  std::vector<std::string> state;  // optimizer state initializers added (moments, step count)
  int update_nodes = 0;
};
// Adds one update per parameter reading `<p>_grad` and the scalar `lr` input, producing
// `<p>.updated` (and `<state>.updated` for its moments) as graph outputs.
OptimizerInfo attach_optimizer(graph::Model& model, const std::vector<std::string>& params,
                               const OptimizerOptions& opts);

// ---- replicate.cc
struct ReplicateOptions {
  int replicas = 1;
  std::vector<std::string> devices;  // one per replica; empty = "cpu:0" .. "cpu:<R-1>"
  bool sync_batchnorm = false;       // training-mode BN over the global batch (see below)
  bool force = false;  // rewrite also when replicas == 1 (other processes share the collectives)
};
// Data parallelism as a graph rewrite, on build_training_graph's single-replica output.
// State = every initializer S with a graph output `S.updated` (weights, BN running statistics,
// optimizer moments, step count).
//   batch    every graph input that is not `loss_scale`, `lr`, state or an initializer keeps its
//            name and becomes the GLOBAL batch; one ai.onnxtrain.ShardBatch(x) -> (x/r0, ..,
//            x/r<R-1>) per input (attribute replicas = R, no device) gives replica k rows
//            [start_k, start_k + size_k), size_k = N/R + (k < N%R), possibly 0.
//   nodes    every other node is cloned once per replica (values and node names + `/r<k>`; a
//            repeated name becomes `<name>_<i>` first, an unnamed node `<op_type>_<i>`, so every placed node has a
//            unique name for export; Node::device = devices[k]); the clones of one original node sit next to each other
//            in the node list, in the original topological order.
//   state    S becomes R initializers S/r<k> (same value, mirrored) updated through the graph
//            outputs `S/r<k>.updated`; S and `S.updated` disappear.
//   shared   `loss_scale`, `lr` and constant initializers stay single values read by all.
//   outputs  each original output O becomes O/r0 .. O/r<R-1> in place (an output that is not
//            per-replica, e.g. a constant, gets one Identity per replica to carry the name).
// Dim 0 symbol N of the batch inputs becomes `N/r<k>` in replica k's value types; a batch of
// known size has its types re-inferred. R == 1 leaves the graph untouched (the pipeline skips
// the pass) unless `force` is set: then it is rewritten like any R (one ShardBatch output, `/r0`
// names), for multi-process runs whose collectives span processes. Checks everything (names free, inputs splittable) before changing the graph.
// sync_batchnorm: each replica's training-mode BatchNormalization (main graph, any opset; an
// opset < 14 node may not have its saved_mean/saved_var read) becomes
// ai.onnxtrain.SyncBatchNormalization(X, scale, B, mean, var) -> (Y, mean', var') and each
// BatchNormalizationGrad(training_mode = 1) becomes SyncBatchNormalizationGrad(dY, X, scale)
// -> (dX, dScale, dB), epsilon and momentum copied, same names: R replicas then compute what one
// replica computes on the global batch. Per-activation BN (opset < 9, spatial = 0) is refused.
void replicate(graph::Model& model, const ReplicateOptions& opts);

// ---- bucket_allreduce.cc
struct BucketOptions {
  double bucket_mb = 25;       // MiB per bucket (PyTorch DDP's default)
  double first_bucket_mb = 1;  // the first bucket (capped at bucket_mb) so the first AllReduce
                               // starts early in backward
  // What the gradients are reduced in (--reduce-precision): float32 = as they are; bfloat16 =
  // each gradient AllReduce gets wire_dtype = bfloat16 (half the bytes on the wire; the sum is
  // float32 rounded to bf16; the optimizer still reads float32). BN statistics stay float32.
  graph::DataType wire_dtype = graph::DataType::kFloat;
};
struct BucketInfo {
  std::vector<std::vector<std::string>> params;  // per bucket: parameters, production order
  std::vector<int64_t> bytes;                    // per bucket: gradient bytes of one replica
  std::vector<std::string> bn_stats;  // BN running statistics averaged by the "mean" AllReduce
  size_t num_buckets() const { return bytes.size(); }
};
// On replicate's output: one ai.onnxtrain.AllReduce(replicas = R, reduction = "sum") per
// bucket of the gradients `<p>_grad/r<k>` that the optimizer reads. Parameters are ordered by
// the topological position of replica 0's gradient producer (backward completion order) and
// packed greedily: the first bucket up to first_bucket_mb, the rest up to bucket_mb; a
// gradient larger than a bucket gets its own. Inputs and outputs are replica-major
// ([g0/r0, .., gG-1/r0, g0/r1, ..]), outputs named `<p>_grad/r<k>/allreduced`; every use of a
// gradient by a node that no gradient depends on (update nodes, ClipByGlobalNorm) reads the
// allreduced value instead. Each AllReduce sits in the node list right after the last producer
// of its inputs. BatchNormalization running statistics get one AllReduce(reduction = "mean")
// whose outputs take the graph-output names `S/r<k>.updated` (the BN outputs become
// `S/r<k>.updated/local`); SyncBatchNormalization statistics (sync_batchnorm) are already the
// global batch's, identical on every replica, and get none. R == 1 graphs (no ShardBatch) are
// refused.
BucketInfo bucket_allreduce(graph::Model& model, const BucketOptions& opts);

// ---- shard_updates.cc
struct ShardInfo {
  int candidates = 0;               // parameters whose gradient a bucket reduces
  int params = 0;                   // of those, updated on one replica and broadcast to the others
  int broadcasts = 0;               // Broadcast nodes added (one per bucket and owner)
  std::vector<int64_t> bytes;       // per replica: bytes of the parameters it updates
  int64_t state_bytes_dropped = 0;  // optimizer state no longer held, over all replicas
};
// On bucket_allreduce's output (one process, R > 1 replicas): ZeRO stage 1 inside the process.
// Each parameter whose reduced gradient has exactly one reader, an update on the same replica
// that rewrites only that replica's weight and optimizer state read by nothing else (reading
// besides only graph inputs, constants and the step count), gets an owner: the replica with
// the fewest parameter bytes so far, in bucket order. The other replicas' updates go, with
// their copies of the optimizer state (initializers, graph outputs, state records). Per bucket
// and owner one ai.onnxtrain.Broadcast(replicas = R, root = owner) follows the owner's last
// update of the bucket: inputs and outputs replica-major like AllReduce; the owner's slots
// read its updated weights (outputs empty), replica k's slots read its current weight and
// output its updated one under the name the signature binds (`S/r<k>.updated`), which the
// kernel writes in place with the owner's bytes. Every replica then ends the step with the
// weights an unsharded graph computes, bit for bit, while each runs about 1/R of the update
// work and holds 1/R of the optimizer state. Updates that do not qualify (clipping, loss
// scaling, kept weight copies) stay on every replica. R < 2 or no buckets: no change.
// Collectives follow the replicas' ranks: build it only for replicas of one process.
ShardInfo shard_updates(graph::Model& model);

// ---- partition.cc
// Replica `replica`'s share of a replicated training graph (replicate's output, after
// bucket_allreduce): the nodes whose Node::replica is `replica`, unreplicated nodes, and that
// replica's slots of the shared ShardBatch / AllReduce nodes (kept outputs keep their names);
// graph outputs, state, gradients and results of other replicas go, and the signature records
// partition = replica. Selected by the recorded replica index, never by device or name, so
// replicas placed on one device are still separate partitions.
void partition(graph::Model& model, int replica);
// One partition per replica of a replicated graph (each a clone passed through partition); a
// graph without ShardBatch/AllReduce nodes (one replica, one process) comes back as one clone.
std::vector<std::unique_ptr<graph::Model>> partition_replicas(const graph::Model& model);

// ---- dce.cc
// Removes nodes whose outputs reach no graph output, then unused initializers, and empties the
// outputs nothing reads of live ai.onnxtrain nodes (their kernels skip omitted outputs, so the
// first ConvGrad computes no dX). Returns the number of nodes removed.
int dce(graph::Model& model);

// ---- optimize_inference.cc
struct InferenceStats {
  int fused_convs = 0;        // Conv chains turned into ai.onnxtrain.FusedConv
  int folded_batchnorms = 0;  // inference BatchNormalization folded into Conv weights / bias
  int fused_adds = 0;         // residual Add computed as the conv's sum post-op
  int fused_relus = 0;        // Relu computed as the conv's eltwise post-op
  int blocked_values = 0;     // values kept in oneDNN's blocked layout between FusedConvs
};
// INFERENCE ONLY (onnxrun; never training graphs, whose BN runs in training mode). Rewrites
// each f32 2-D Conv with constant weights (and bias) into ai.onnxtrain.FusedConv, absorbing
// the chain after it when each link is the sole reader of the previous value: an inference
// BatchNormalization with constant parameters (folded into new weights and bias in double),
// then a same-shape Add (its other input becomes the FusedConv's Z), then a Relu. Outputs
// keep their names. A FusedConv output read only by FusedConvs (as X or Z), not a graph
// output and with channels % 16 == 0, is marked blocked on both sides (x/y/z_blocked), so it
// stays in oneDNN's nChw16c / nChw8c layout between them. Runs infer_shapes first and dce
// after; what the graph computes is unchanged up to float rounding of the folded weights.
InferenceStats optimize_inference(graph::Model& model);

// ---- conv_algorithm.cc
// --conv-algorithm: direct (oneDNN's direct convolutions, the default; what PyTorch and
// TensorFlow run on CPUs) or winograd (oneDNN's Winograd kernels for 3x3 stride-1 convolutions
// over maps of at least 7x7: 1.2-2.7x faster on AVX-512, at a larger rounding error: relative
// RMS error of one 3x3 conv 9e-7 vs 1.7e-7 direct, measured against float64).
enum class ConvAlgorithm { kDirect, kWinograd };
// "direct" | "winograd"; nullopt for any other name.
std::optional<ConvAlgorithm> parse_conv_algorithm(const std::string& name);
struct ConvAlgorithmStats {
  int forward = 0, backward = 0;                    // Conv + FusedConv nodes, ConvGrad nodes
  int winograd_forward = 0, winograd_backward = 0;  // of those, marked winograd
};
// kWinograd: sets conv_algorithm = "winograd" (ops/nn/conv_algorithm.h) on every Conv,
// FusedConv and ConvGrad of the top graph that ops::winograd_eligible allows (2-D 3x3, stride
// 1, no dilation, one group, float32, output maps of at least 7x7; shapes known, so run
// infer_shapes first); their kernels fall back to direct where oneDNN has no Winograd kernel.
// kDirect changes nothing. Counts the convolutions either way.
ConvAlgorithmStats select_conv_algorithm(graph::Model& model, ConvAlgorithm algorithm);

// ---- fuse_batchnorm_relu.cc
struct BatchNormReluStats {
  int batchnorms = 0;   // ai.onnx BatchNormalization nodes
  int fused = 0;        // of those, computing their Relu (fused_relu = 1)
  int fused_residual = 0;  // of those, also the residual Add before it (fused_add = 1)
  int fused_grads = 0;  // BatchNormalizationGrad nodes that absorbed the ReluGrad
  int fused_sums = 0;   // ReluGrad nodes that absorbed the Sum of their dY (ReluGrad(a, Y, b))
};
// After autodiff, for CPU kernels (ops/nn/batch_norm_relu.h; the CUDA kernels leave marked nodes
// to the CPU ones, so the Trainer turns it off for CUDA devices): each ai.onnx
// BatchNormalization whose output is read only by one Relu writes the Relu's output itself
// (fused_relu = 1; the value keeps the Relu output's name), or only by one Add(., R) -- same
// shape and dtype, no broadcast -- whose output only one Relu reads, writes that Relu's output
// with R as its residual input (fused_add = 1 too), and each ReluGrad(dZ, Z) of such a
// Z whose result is only that BatchNormalization's BatchNormalizationGrad dY is folded into it
// (dZ in slot 0, Z in slot ops::kBatchNormGradReluOutput, fused_relu = 1). Then each other
// ReluGrad(Sum(a, b), Y) whose Sum only it reads (one static shape) becomes ReluGrad(a, Y, b).
// Every value the graph computes is bit-identical to the unfused graph's.
BatchNormReluStats fuse_batchnorm_relu(graph::Model& model);

// ---- keep_lstm_traces.cc
// After autodiff: each ai.onnx LSTM whose Y an ai.onnxtrain LSTMGrad reads becomes ai.onnxtrain
// LSTMTraining (same inputs, attributes and outputs 0-2), whose output 3 is its trace: the gates
// after activation and the h and c states of every step (ops/nn/rnn.cc), which the LSTMGrad
// reads as input 10 instead of recomputing the forward (one product over every step through X
// and one through H, and the cell). Costs the trace's memory from the forward to the gradient
// ((4 + 2) x the hidden state per step). Returns the LSTMs rewritten. Computes the same
// gradients, up to float rounding (the forward's per-step products round differently from the
// recomputation's one product over all steps).
int keep_lstm_traces(graph::Model& model);

// ---- fold_transposes.cc
struct TransposeFoldStats {
  int matmul_operands = 0;  // Transposes a MatMul now reads through (FusedMatMul transA/transB)
  int gemm_outputs = 0;     // Transposes of a Gemm's result now written by the Gemm itself
};
// After autodiff, for CPU kernels (the CUDA ones have no FusedMatMul: the Trainer turns it off
// for CUDA devices): a MatMul operand produced by a Transpose that swaps only its last two dims
// is read through that Transpose's input by ai.onnxtrain FusedMatMul with transA / transB set
// (a Transpose of a Transpose toggles back; both flags off leaves a MatMul), and a 2-D Transpose
// of a Gemm's result that nothing else reads becomes the Gemm itself with its operands swapped
// and their flags swapped and negated (the Gemm's output takes the Transpose output's name:
// records naming it stay true). dce then drops Transposes left unread. Torch's dynamo exporter
// writes a Linear as MatMul(X, Transpose(W)) and attention as MatMul(Q, Transpose(K)); autodiff
// transposes those again for the gradients: BERT h256 L4 has 130 Transposes per training step,
// most of them these. Computes the same products (oneDNN reads the operand strided).
TransposeFoldStats fold_transposes(graph::Model& model);

// ---- block_layout.cc
struct BlockLayoutStats {
  int blocked_values = 0;  // activations kept in the blocked channel layout
  int convolutions = 0;    // Conv / ConvGrad nodes with a blocked port
  int batchnorms = 0;      // BatchNormalization(Grad) nodes marked blocked
};
// Training graphs whose kernels run on the CPU (ops/nn/blocked_layout.h; the Trainer turns it
// off for CUDA devices), after fuse_batchnorm_relu and dce: activations passed between
// convolutions keep oneDNN's blocked channel layout instead of being reordered from and to
// plain NCHW around every Conv / ConvGrad primitive. Values joined by elementwise nodes over
// one shape (Relu, Add, Sum, Cast, ReluGrad) or by a training-mode BatchNormalization(Grad)
// share a layout; such a set is blocked when each value is a 4-D float32 / bf16 activation with
// channels % 16 == 0, no graph input, output or initializer, and every other node touching it
// does so through a port: Conv x / y, ConvGrad dy / x / dx (marked x_blocked, y_blocked,
// dy_blocked, dx_blocked = 1), or reads only its shape or dtype (Shape, Size, CastLike's target:
// torch's dynamo exporter reads activations so); BatchNormalization(Grad) nodes of a blocked set get blocked = 1
// (ops/nn/batch_norm_relu.h). Elementwise nodes carry no mark: they compute the same in either
// layout. What the graph computes is unchanged up to float summation order.
BlockLayoutStats block_layout(graph::Model& model);

// ---- keep_weight_copies.cc
struct WeightCopyStats {
  int copies = 0;          // weights with a kept bf16 copy
  int64_t elements = 0;    // their elements
  int bf16_gradients = 0;  // updates reading their bf16 gradient (no float32 Cast of it)
};
// bf16 mixed precision (after attach_optimizer), for each float32 parameter whose update node
// holds that one parameter (as attach_optimizer makes them):
// - Kept copies: when only bias-free Conv nodes over bf16 activations (as W) and their ConvGrads
//   (as W) read it besides its update, it gets a kept copy -- state of kind kWeightCopy,
//   initialized to the master rounded to bf16 (nearest even), and a `copies` record -- which
//   those nodes read instead; the ConvGrads get grad_dtype = float (ops/precision.h), so dW and
//   dB stay float32 (unless the update reads dW in bf16, below). The update (moved to its
//   ai.onnxtrain form) gets copy_dtype = bfloat16 and
//   writes the copy as one more output, from each row of the new weight while it is in cache.
//   The convolutions then no longer round the float32 master on every read (the forward's
//   reorder into its blocked layout, backward-data's, the small-map GEMMs' copy): they read bf16
//   values, the same ones.
// - bf16 gradients (`bf16_gradients`; callers pass false for graphs they will replicate, whose
//   AllReduce buckets reduce float32 gradients), where nothing but the update reads the
//   gradient: the update (in its ai.onnxtrain form) reads a bf16 gradient and widens it itself
//   (ops/optim/copy.h); the gradient record names the bf16 value. The float32 gradient is never
//   written and read back.
//   - a Gemm/MatMul weight autocast cast down: its gradient is a Cast of a bf16 value, which
//     the update reads instead (dce removes the Cast). The same values: bit for bit.
//   - a kept copy's only ConvGrad writing dW alone: dW stays in the copy's bf16 (no
//     grad_dtype), the float32 sum rounded once to nearest even -- what torch.autocast's
//     gradient of its bf16 weight copy is. Not bit for bit: dW's own rounding (ResNet-50 64²
//     b16, 2 threads: ConvGrads and Adam 2.5 ms less per 116 ms step).
// The copies alone train bit for bit like the graph without them. Other dtypes: nothing
// happens.
WeightCopyStats keep_weight_copies(graph::Model& model, bool bf16_gradients);

// ---- schedule_updates.cc
struct UpdateScheduleStats {
  int update_nodes = 0;  // nodes whose every output updates a parameter / optimizer state / step
  int interleaved = 0;   // of those, placed ahead of the last other node (during the backward)
};
// The last pass of build_training_graph: each node computing only state updates (an optimizer
// node: weight, moments; the step count) moves in the node list to right behind the latest
// node it has to follow -- the producers of its inputs and every other reader of the state it
// updates -- so the executor, which follows the list (graph::Graph::topological_order is
// stable), updates a weight as soon as its gradient is ready instead of after the whole
// backward: the gradient and weight are still in cache, the gradient's buffer is free for the
// rest of the backward, and the runtime still writes the update in place (no later node reads
// the state). A global dependency stays one: clipping's norm and loss scaling's grads_finite
// are inputs of the updates. Running statistics (BatchNormalization's outputs), graphs with
// subgraph nodes and replicated graphs (gradient buckets: bucket_allreduce's order, which
// scales better) keep their order; if the result were not topological (a node
// reading both a state and its update) the order is left as it was. Computes the same values.
UpdateScheduleStats schedule_updates(graph::Model& model);

// ---- pipeline.cc
struct TrainingOptions {
  TrainableOptions trainable;
  std::string output;  // model output to train ("" = auto)
  LossKind loss = LossKind::kAuto;
  int64_t class_axis = 1;               // LossOptions::class_axis
  std::optional<int64_t> ignore_index;  // LossOptions::ignore_index
  std::optional<bool> integer_labels;   // LossOptions::integer_labels
  OptimizerOptions optimizer;
  int replicas = 1;                  // > 1: replicate + bucket_allreduce after the optimizer
  std::vector<std::string> devices;  // ReplicateOptions::devices
  bool sync_batchnorm = false;       // ReplicateOptions::sync_batchnorm
  double bucket_mb = 25;             // BucketOptions::bucket_mb
  graph::DataType reduce_dtype = graph::DataType::kFloat;  // BucketOptions::wire_dtype
  // Replicate and bucket also when replicas == 1 (ReplicateOptions::force): the AllReduce nodes
  // then span the processes of a multi-process (MPI) run.
  bool collectives = false;
  // shard_updates after bucket_allreduce (replicas > 1 and not collectives: one process's
  // replicas; the Trainer turns it off for CUDA devices).
  bool shard_updates = true;
  // Mixed precision (autocast after prepare_training): bf16 / f16; float32 = none.
  graph::DataType precision = graph::DataType::kFloat;
  // select_conv_algorithm after autodiff (and on the evaluation graph).
  ConvAlgorithm conv_algorithm = ConvAlgorithm::kDirect;
  // fuse_batchnorm_relu after autodiff unless sync_batchnorm is set (replicate rewrites unfused
  // BatchNormalization nodes only). Callers placing the graph on CUDA devices turn it off (the
  // Trainer does): those kernels do not implement the marks.
  bool fuse_batchnorm_relu = true;
  // fold_transposes after autodiff; off for CUDA devices likewise (no FusedMatMul kernel).
  bool fold_transposes = true;
  // keep_lstm_traces after autodiff (CPU and CUDA: the LSTM kernels run on the host either way).
  bool keep_lstm_traces = true;
  // block_layout after dce, with the same conditions as fuse_batchnorm_relu (CPU kernels only;
  // replicate's SyncBatchNormalization reads plain values).
  bool block_layout = true;
  // schedule_updates last; off: the updates run after the whole backward, in the order
  // attach_optimizer (or bucket_allreduce) left them.
  bool schedule_updates = true;
  // keep_weight_copies after attach_optimizer (bf16 only). Callers placing the graph on CUDA
  // devices turn it off (the Trainer does), as the fusions.
  bool keep_weight_copies = true;
  // Its bf16 gradients (single-process graphs with replicas == 1 only: the replicated ones
  // AllReduce float32); off: the copies alone, float32 gradients (the tests' reference for
  // training bit for bit like the graph without copies).
  bool bf16_gradients = true;
};
// The loss options of `opts`, with `kind` for its kind (build_evaluation_graph passes the
// resolved one).
inline LossOptions loss_options(const TrainingOptions& opts, LossKind kind) {
  LossOptions l;
  l.kind = kind;
  l.class_axis = opts.class_axis;
  l.ignore_index = opts.ignore_index;
  l.integer_labels = opts.integer_labels;
  return l;
}
struct TrainingGraphInfo {
  PreparedModel prepared;
  LossInfo loss;
  GradientInfo gradients;
  OptimizerInfo optimizer;
  BucketInfo buckets;  // empty for one replica
  ShardInfo sharded;   // zeros when not run
  AutocastInfo autocast;  // zeros without mixed precision
  ConvAlgorithmStats conv_algorithm;
  BatchNormReluStats batchnorm_relu;  // zeros when not fused
  TransposeFoldStats transposes;      // zeros when not run
  int lstm_traces = 0;                // LSTMs rewritten by keep_lstm_traces
  BlockLayoutStats block_layout;      // zeros when not run
  UpdateScheduleStats schedule;
  WeightCopyStats weight_copies;  // zeros when not run
};
// lower_sequences (every one, or an error naming those that stay) -> infer_shapes ->
// prepare_training (-> autocast with a low precision) -> attach_loss -> autodiff ->
// select_conv_algorithm (-> fuse_batchnorm_relu) (-> fold_transposes) (-> keep_lstm_traces)
// -> attach_optimizer
// (-> keep_weight_copies)
// -> dce (-> block_layout)
// (-> replicate ->
// bucket_allreduce -> dce when replicas > 1 or collectives) (-> shard_updates) -> schedule_updates,
// the verifier after each.
TrainingGraphInfo build_training_graph(graph::Model& model, const TrainingOptions& opts);

// ---- evaluation.cc
// The evaluation (validation) graph of `original`: the inference model (BatchNormalization and
// Dropout stay in inference mode) plus the loss and `correct` that build_training_graph would
// attach with the same options, resolved to `loss` (never kAuto; pass the training graph's
// LossInfo::kind). Every initializer named in `state` (the trained values, by single-replica
// name) becomes a graph input with role InputRole::kState, fed from the training state at each
// evaluation. The signature lists batch, labels/targets, loss_scale and the state inputs, and
// the loss and correct results.
std::unique_ptr<graph::Model> build_evaluation_graph(const graph::Model& original,
                                                     const TrainingOptions& opts, LossKind loss,
                                                     const std::vector<std::string>& state);

}  // namespace onnxtrain::passes
