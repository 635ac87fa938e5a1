// CPU kernels of the ops that talk to other replicas (ai.onnxtrain AllReduce,
// SyncBatchNormalization, SyncBatchNormalizationGrad). They live in runtime/, not ops/, because
// they call the session's Communicator (communicator_of), which kernels in ops/ cannot see; their
// schemas are in ops/ (passes need the shape inference).
#pragma once

namespace onnxtrain::runtime {

// Installs the kernels into the op registry (once; later calls do nothing).
void register_collective_kernels();

#if ONNXTRAIN_WITH_CUDA
// Installs AllReduce's CUDA kernel (runtime/collective_kernels_cuda.cc: NCCL on the
// communicator's stream; other communicators fall back to the CPU kernel). Called by
// register_collective_kernels.
void install_collective_cuda_kernels();
#endif

}  // namespace onnxtrain::runtime
