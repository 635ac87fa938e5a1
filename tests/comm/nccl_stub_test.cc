// make_nccl_communicators in a build without the CUDA backend: a clear Error, no crash.
#include <gtest/gtest.h>

#include <string>

#include "graph/error.h"
#include "runtime/comm/nccl_factory.h"

namespace onnxtrain::runtime {
namespace {

TEST(NcclStub, FactoryNamesTheMissingBackend) {
  try {
    make_nccl_communicators({0, 1}, nullptr);
    FAIL() << "the stub returned communicators";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without the CUDA backend"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain::runtime
