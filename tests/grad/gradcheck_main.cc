// main() of the gradcheck binary: runs every case, then fails when a registered gradient rule
// was never checked (a new rule needs a case in tests/grad/*_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>

#include "ops/op_api.h"
#include "runtime/device/device.h"
#include "tests/grad/gradcheck.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // The gpu-labelled run (ONNXTRAIN_TEST_DEVICE=cuda) skips on a machine without a GPU.
  const char* device = std::getenv("ONNXTRAIN_TEST_DEVICE");
  if (device && std::string(device).rfind("cuda", 0) == 0 &&
      onnxtrain::runtime::cuda_device_count() == 0) {
    std::printf("gradcheck: SKIPPED, no CUDA GPU found (ONNXTRAIN_TEST_DEVICE=%s)\n", device);
    return 77;
  }
  std::printf("gradcheck: device %s\n", onnxtrain::testing::test_device()->name().c_str());
  const int rc = RUN_ALL_TESTS();
  const bool filtered = ::testing::GTEST_FLAG(filter) != "*";
  std::vector<std::string> unchecked;
  for (const onnxtrain::ops::OpSchema* s : onnxtrain::ops::OpRegistry::global().all()) {
    if (!s->gradient) continue;
    const std::string key = onnxtrain::testing::gradient_rule_key(s->domain, s->op_type);
    if (!onnxtrain::testing::checked_gradient_rules().count(key)) unchecked.push_back(key);
  }
  std::sort(unchecked.begin(), unchecked.end());
  unchecked.erase(std::unique(unchecked.begin(), unchecked.end()), unchecked.end());
  std::printf("gradcheck: %zu gradient rules checked\n",
              onnxtrain::testing::checked_gradient_rules().size());
  if (!unchecked.empty() && !filtered) {
    std::string list;
    for (const std::string& u : unchecked) list += " " + u;
    std::printf("gradcheck: %zu registered gradient rules have no case:%s\n", unchecked.size(),
                list.c_str());
    return 1;
  }
  return rc;
}
