// NumPy .npy files <-> host tensors (format versions 1.0-3.0, little-endian, C order), and
// ONNX TensorProto .pb files (the backend suite's input/output format).
#pragma once

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/tensor.h"

namespace onnxtrain::runtime {

graph::Tensor read_npy(const std::string& path);
// The same from a stream of `size` bytes positioned at the magic; `path` names it in errors
// ("train.npz:input_ids.npy").
graph::Tensor read_npy_stream(std::istream& in, int64_t size, const std::string& path);
// The arrays of a NumPy .npz archive (np.savez / np.savez_compressed: a zip of .npy members,
// stored or deflated, zip64 included), in archive order, named without ".npy". Every size and
// offset is checked against the file before allocating; CRC-32 checked; errors name the file
// and member.
std::vector<std::pair<std::string, graph::Tensor>> read_npz(const std::string& path);
// One array of a .npz (reading only that member); nullopt when it has none of that name.
std::optional<graph::Tensor> read_npz_array(const std::string& path, const std::string& name);
// Writes atomically (temporary file + rename). Throws for dtypes .npy cannot hold.
void write_npy(const std::string& path, const graph::Tensor& t);
// True for the dtypes read_npy / write_npy handle: f16 f32 f64 i8-i64 u8-u64 bool.
bool npy_supports(graph::DataType t);
graph::Tensor read_tensor_pb(const std::string& path);
// Dispatches on the extension: .npy or .pb.
graph::Tensor read_tensor_file(const std::string& path);

}  // namespace onnxtrain::runtime
