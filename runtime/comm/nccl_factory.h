// NCCL communicators behind the CUDA-free Communicator interface, for code that compiles with and
// without the CUDA backend (the trainer, tools). The NCCL type itself is in runtime/comm/nccl.h.
#pragma once

#include <memory>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/process_world.h"

namespace onnxtrain::runtime {

// NCCL communicators for this process's replicas (one per CUDA device index; world may be null).
// Element k drives cuda_devices[k] and is rank k (world null: ncclCommInitAll over this process)
// or rank world->rank() * cuda_devices.size() + k (every process of `world` joins; collective
// over `world`). Throws Error "... built without the CUDA backend" when ONNXTRAIN_WITH_CUDA is 0.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(
    const std::vector<int>& cuda_devices, ProcessWorld* world);

}  // namespace onnxtrain::runtime
