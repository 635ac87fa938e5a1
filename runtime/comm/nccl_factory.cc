// make_nccl_communicators for builds without the CUDA backend; the CUDA build defines it in
// runtime/comm/nccl.cc.
#include "runtime/comm/nccl_factory.h"

#include "graph/error.h"

namespace onnxtrain::runtime {

#if !ONNXTRAIN_WITH_CUDA
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(
    const std::vector<int>& cuda_devices, ProcessWorld* world) {
  fail("NCCL communicators for ", cuda_devices.size(),
       " CUDA device(s) requested, but onnxtrain was built without the CUDA backend "
       "(configure with a CUDA toolkit and -DONNXTRAIN_CUDA=ON)");
}
#endif

}  // namespace onnxtrain::runtime
