// Which GPUs this build's own CUDA kernels (ops/cuda/*.cu) load on: the CUDA architecture list
// CMake compiled them for (CMAKE_CUDA_ARCHITECTURES, cmake/cuda.cmake), read back at run time so
// that a GPU the build does not cover is refused when its device is opened, with the rebuild
// that fixes it, instead of failing at the first kernel launch inside a step. cuDNN and cuBLAS
// ship kernels for every GPU; ours exist only for the listed architectures. Host-only: no CUDA
// headers, so the rules are tested on machines without a GPU.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace onnxtrain::ops {

// The list CMake compiled ops/cuda for, e.g. "90-real,80-virtual" ("" without the backend).
std::string_view cuda_built_archs();

// Whether kernels built for `archs` (CMake's syntax: entries "XY" = machine code + PTX,
// "XY-real" = machine code, "XY-virtual" = PTX; ';'- or ','-separated) load on a GPU of compute
// capability major.minor. Machine code for sm_XY runs on X.Y and later minor versions of the
// same major; PTX for compute_XY is compiled by the driver for any GPU of X.Y or newer.
// nullopt when the list is symbolic ("native", "all", "all-major") or unparsable: then only
// loading a kernel tells.
std::optional<bool> cuda_archs_cover(std::string_view archs, int major, int minor);

// "sm_90 machine code, compute_80 PTX" for messages.
std::string describe_cuda_archs(std::string_view archs);

// With the CUDA backend: whether this build's kernels load on `device` (asks the driver for a
// kernel's attributes there). Defined in ops/cuda/cuda_common.cu.
bool cuda_kernels_load(int device);

}  // namespace onnxtrain::ops
