// ONNX <-> IR. Import reads untrusted files: every size, offset, path and nesting depth is
// checked, and failures throw Error with "<file>: <field>: <problem>" on one line.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "graph/ir.h"

namespace onnxtrain::graph {

struct LoadOptions {
  // Largest single tensor (initializer, attribute or external-data block) accepted.
  int64_t max_tensor_bytes = int64_t{4} << 30;
  // Largest model file accepted (protobuf itself stops at 2 GiB).
  int64_t max_file_bytes = int64_t{2} << 30;
  // Graph attributes nested deeper than this (If inside Loop inside ...) are refused.
  int max_subgraph_depth = 16;
  // Run the verifier after import.
  bool verify = true;
};

// `path` names the file in errors and anchors external data; `base_dir` may be empty when the
// model has no external data (bytes from memory).
std::unique_ptr<Model> import_onnx_file(const std::string& path, const LoadOptions& opts = {});
std::unique_ptr<Model> import_onnx_bytes(std::string_view bytes, const std::string& display_name,
                                         const std::string& base_dir,
                                         const LoadOptions& opts = {});

// One serialized onnx.TensorProto (the backend suite's input_0.pb files); external data is
// refused. Same checks as initializers.
Tensor import_tensor_proto(std::string_view bytes, const std::string& display_name,
                           const LoadOptions& opts = {});

struct SaveOptions {
  // Initializers of at least this many bytes go to an external data file when > 0.
  int64_t external_data_threshold = 0;
  // File name (next to the model) for external data; default "<model file name>.data".
  std::string external_data_file;
};

// Writes atomically (temporary file + rename) so a failure never leaves a half-written model.
void export_onnx_file(const Model& m, const std::string& path, const SaveOptions& opts = {});
std::string export_onnx_bytes(const Model& m);

}  // namespace onnxtrain::graph
