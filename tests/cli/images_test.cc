// onnxtrain on a real folder of image files (issue #21): Fashion-MNIST test images written as
// PNG and JPEG, gray and RGB, at 20..40 px, in class folders; the zoo CNN trains on them through
// the streaming images: source with --augment basic and learns. Bad files stop the run with the
// file's name, or are skipped, named and counted.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "runtime/data/dataset.h"
#include "tests/cli/cli_support.h"
#include "tests/dataset/test_files.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using cli_test::lines_of;
using cli_test::run_process;
using cli_test::RunResult;

const std::string kOnnxtrain = ONNXTRAIN_BIN_DIR "/onnxtrain";
const std::string kOnnxzoo = ONNXTRAIN_BIN_DIR "/onnxzoo";
const std::string kFashion = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";

double json_value(const std::string& line, const std::string& key) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(line, m, std::regex("\"" + key + "\": (-?[0-9.eE+-]+)")))
      << key << " in " << line;
  return m.empty() ? 0 : std::stod(m[1]);
}

class ImagesCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = cli_test::fresh_test_dir("onnxtrain_images_"); }
  void TearDown() override {
    std::error_code ec;
    if (!HasFailure() && !std::getenv("KEEP")) fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  RunResult run(std::vector<std::string> args, const std::string& bin = kOnnxtrain) {
    args.insert(args.begin(), bin);
    return run_process(args, dir_);
  }
  std::string cnn() {
    RunResult r = run({"cnn", "--input", "1x28x28", "--width", "8", "-o", path("cnn.onnx")},
                      kOnnxzoo);
    EXPECT_EQ(r.rc, 0) << r.err;
    return path("cnn.onnx");
  }
  // The first `n` Fashion-MNIST test images as DIR/<class>/<i>.png|jpg: every 3rd a gray PNG,
  // then an RGB JPEG (tinted), then an RGB PNG; side 20..40 px (nearest-neighbour resize).
  std::string write_images(const std::string& name, int n) {
    runtime::LoadedData fm = runtime::load_dataset(runtime::parse_data_spec("fashion-mnist"), {});
    const runtime::Dataset& test = *fm.test;
    const fs::path root = dir_ / name;
    std::vector<float> x(784);
    for (int i = 0; i < n; ++i) {
      test.read_example(i, x.data());
      const int side = 20 + (i * 7) % 21, kind = i % 3, c = kind == 0 ? 1 : 3;
      std::vector<uint8_t> px(static_cast<size_t>(side * side * c));
      for (int y = 0; y < side; ++y)
        for (int xx = 0; xx < side; ++xx) {
          const float v = x[static_cast<size_t>((y * 28 / side) * 28 + xx * 28 / side)];
          for (int k = 0; k < c; ++k)
            px[static_cast<size_t>((y * side + xx) * c + k)] =
                static_cast<uint8_t>(std::min(255.0f, v * 255.0f * (k == 2 ? 0.8f : 1.0f)));
        }
      const fs::path cls = root / ("class" + std::to_string(test.label(i)));
      fs::create_directories(cls);
      const std::string file = (cls / (std::to_string(10000 + i) + (kind == 1 ? ".jpg" : ".png"))).string();
      if (kind == 1)
        runtime::testing::write_jpeg(file, side, side, c, px);
      else
        runtime::testing::write_png(file, side, side, c, px);
    }
    return root.string();
  }
  fs::path dir_;
};

TEST_F(ImagesCliTest, CnnLearnsFromAFolderOfPngAndJpegWithAugmentation) {
  if (!fs::is_regular_file(kFashion)) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const std::string images = write_images("fm", 1500);
  const std::string model = cnn();
  RunResult r = run({model, "--data", "images:" + images, "--val-split", "0.2", "--augment",
                     "basic", "--epochs", "6", "--batch-size", "32", "--lr", "3e-3",
                     "--threads", "1", "--data-workers", "2", "--seed", "1",
                     "--metrics-json", path("m.jsonl"), "--output", path("trained.onnx")});
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  // 1500 listed, 300 held out; a grayscale input: no default normalization.
  EXPECT_NE(r.out.find("(train split): 1200 examples, decoded per batch by 2 workers, augment "
                       "basic\n"),
            std::string::npos)
      << r.out;
  const std::vector<std::string> epochs = lines_of(cli_test::read_file(path("m.jsonl")));
  ASSERT_EQ(epochs.size(), 6u);
  const double first = json_value(epochs.front(), "val_accuracy");
  const double last = json_value(epochs.back(), "val_accuracy");
  // 10 classes: chance is 0.1. Augmented, 1200 images and 6 epochs reach well above it.
  EXPECT_GT(last, 0.5) << r.out;
  EXPECT_GT(last, first) << r.out;
  EXPECT_TRUE(fs::is_regular_file(path("trained.onnx")));
}

TEST_F(ImagesCliTest, BadImageStopsNamingTheFileOrIsSkippedAndCounted) {
  if (!fs::is_regular_file(kFashion)) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const std::string images = write_images("bad", 40);
  const std::string bad = images + "/class9/10000.png";  // test image 0 is an ankle boot (9)
  ASSERT_TRUE(fs::is_regular_file(bad));
  runtime::testing::write_bytes(bad, {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'});
  const std::string model = cnn();
  std::vector<std::string> args = {model, "--data", "images:" + images, "--val-data", "none",
                                   "--epochs", "2", "--batch-size", "8", "--threads", "1"};
  RunResult stop = run(args);
  EXPECT_EQ(stop.rc, 1) << stop.err;
  EXPECT_EQ(stop.err, "onnxtrain: error: " + bad +
                          ": unreadable image: neither a JPEG (FF D8 FF) nor a PNG signature at "
                          "offset 0\n");
  args.insert(args.end(), {"--on-bad-image", "skip"});
  RunResult skip = run(args);
  ASSERT_EQ(skip.rc, 0) << skip.err;
  // Named once (the first time it is met), then counted per epoch: once in each of 2 epochs.
  size_t named = 0;
  for (size_t at = skip.err.find(bad); at != std::string::npos; at = skip.err.find(bad, at + 1))
    ++named;
  EXPECT_EQ(named, 1u) << skip.err;
  EXPECT_NE(skip.err.find("1 unreadable image skipped so far (epoch 1"), std::string::npos)
      << skip.err;
  EXPECT_NE(skip.err.find("2 unreadable images skipped so far (epoch 2"), std::string::npos)
      << skip.err;
  // Flags are checked before anything runs.
  RunResult flag = run({model, "--augment", "heavy"});
  EXPECT_EQ(flag.rc, 2) << flag.err;
  EXPECT_NE(flag.err.find("--augment: expected none, basic or imagenet, got 'heavy'"),
            std::string::npos)
      << flag.err;
}

}  // namespace
}  // namespace onnxtrain
