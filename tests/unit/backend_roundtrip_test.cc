// Every model.onnx of the ONNX backend test data (Debian libonnx-testdata) must survive
// import -> export -> import unchanged. Prints how many models it walked.
#include <gtest/gtest.h>

#include <filesystem>

#include "graph/compare.h"
#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/printer.h"

namespace onnxtrain::graph {
namespace {

namespace fs = std::filesystem;
constexpr const char* kDataDir = "/usr/share/libonnx-testdata/data";

TEST(BackendRoundTrip, EveryModelRoundTrips) {
  if (!fs::is_directory(kDataDir)) GTEST_SKIP() << kDataDir << " missing (apt-get install libonnx-testdata)";
  std::vector<fs::path> models;
  for (const auto& e : fs::recursive_directory_iterator(kDataDir))
    if (e.path().filename() == "model.onnx") models.push_back(e.path());
  std::sort(models.begin(), models.end());
  int walked = 0, failed = 0;
  for (const auto& p : models) {
    try {
      auto first = import_onnx_file(p.string());
      auto second = import_onnx_bytes(export_onnx_bytes(*first), p.string(), p.parent_path().string());
      std::string why;
      if (!models_equal(*first, *second, &why)) {
        ADD_FAILURE() << p << ": round trip differs: " << why;
        ++failed;
      }
      // The printer handles everything the loader produces.
      EXPECT_FALSE(to_text(*first->graph).empty());
    } catch (const Error& e) {
      ADD_FAILURE() << p << ": " << e.what();
      ++failed;
    }
    ++walked;
  }
  std::printf("walked %d backend test models, %d failed\n", walked, failed);
  EXPECT_GT(walked, 1000);
}

}  // namespace
}  // namespace onnxtrain::graph
