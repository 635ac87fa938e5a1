// NumPy .npy files <-> host tensors (format versions 1.0-3.0, little-endian, C order), and
// ONNX TensorProto .pb files (the backend suite's input/output format).
#pragma once

#include <string>

#include "graph/tensor.h"

namespace onnxtrain::runtime {

graph::Tensor read_npy(const std::string& path);
void write_npy(const std::string& path, const graph::Tensor& t);
graph::Tensor read_tensor_pb(const std::string& path);
// Dispatches on the extension: .npy or .pb.
graph::Tensor read_tensor_file(const std::string& path);

}  // namespace onnxtrain::runtime
