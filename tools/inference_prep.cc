// prepare_inference (inference_prep.h).
#include "tools/inference_prep.h"

#include "graph/error.h"
#include "ops/precision.h"
#include "runtime/session.h"

namespace onnxtrain::tools {

InferencePrep prepare_inference(graph::Model& model, const runtime::Device& device,
                                const InferencePrepOptions& options, const std::string& path) {
  using graph::DataType;
  // Sequences with a static structure become tensor ops; the check names any that stay.
  passes::lower_sequences(model);
  runtime::require_supported_ops(model, path);
  InferencePrep prep;
  if (options.precision != DataType::kFloat) {
    const std::string why = runtime::precision_refusal(device, options.precision);
    OT_CHECK(options.allow_emulation || why.empty(), why);
  }
  // Models run forward only, so the inference rewrite applies; a BatchNormalization in
  // training mode (an exported training graph) is left alone by the pass itself.
  if (options.optimize && device.host_memory() &&
      (options.precision == DataType::kFloat || ops::cpu_runs_natively(options.precision)))
    prep.fusion = passes::optimize_inference(model);
  // Both passes below read types: autocast the dtypes, the Winograd rule the weights' shapes
  // and x's dtype (autocast types the Casts it adds, so one inference serves both).
  const bool winograd = options.conv_algorithm != passes::ConvAlgorithm::kDirect;
  if (options.precision != DataType::kFloat || winograd) passes::infer_shapes(model);
  // Mixed precision as onnxtrain --precision: Conv/Gemm/MatMul (and FusedConv) compute in bf16
  // / f16, BatchNormalization, Relu, Add and pooling follow, the rest reads float32.
  if (options.precision != DataType::kFloat)
    prep.autocast = passes::autocast(model, options.precision, {});
  if (winograd) prep.conv = passes::select_conv_algorithm(model, options.conv_algorithm);
  return prep;
}

}  // namespace onnxtrain::tools
