// What a model goes through before an InferenceSession runs it forward, in one place for onnxrun
// and the Python API's onnxtrain.run: static sequence ops lowered, unsupported ops named, the
// inference rewrite (passes::optimize_inference), mixed precision (passes::autocast) and the
// convolution algorithm (passes::select_conv_algorithm).
#pragma once

#include <optional>
#include <string>

#include "graph/ir.h"
#include "passes/passes.h"
#include "runtime/device/device.h"

namespace onnxtrain::tools {

struct InferencePrepOptions {
  bool optimize = true;  // --no-optimize: false
  graph::DataType precision = graph::DataType::kFloat;
  bool allow_emulation = false;
  passes::ConvAlgorithm conv_algorithm = passes::ConvAlgorithm::kDirect;
};

struct InferencePrep {
  std::optional<passes::InferenceStats> fusion;    // set when optimize_inference ran
  std::optional<passes::AutocastInfo> autocast;    // set when precision is not float32
  std::optional<passes::ConvAlgorithmStats> conv;  // set when the algorithm is not direct
};

// Rewrites `model` (read from `path`, named in errors) for `device`. The fused convolutions
// are oneDNN kernels: they run where the device's memory is the host's, and under a low
// precision only where the CPU has it natively (ops::cpu_runs_natively: each FusedConv then
// computes in it like a Conv, its blocked values between FusedConvs stored in it); otherwise the
// graph runs as written. Throws runtime::precision_refusal's message for a precision the
// device has no native kernels for, unless allow_emulation.
InferencePrep prepare_inference(graph::Model& model, const runtime::Device& device,
                                const InferencePrepOptions& options, const std::string& path);

}  // namespace onnxtrain::tools
