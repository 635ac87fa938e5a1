// Dataset sources: fashion-mnist against the raw file bytes, the spec parser, npy pairs, image
// folders written here with libpng/libturbojpeg, synthetic data, and train/val selection.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "graph/tensor.h"
#include "runtime/data/dataset.h"
#include "runtime/data/transform.h"
#include "runtime/npy.h"
#include "tests/dataset/test_files.h"

namespace onnxtrain::runtime {
namespace {

using testing::error_of;
using testing::ScratchDir;

constexpr const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

// Loaded once for the whole suite: decoding 70000 images twice would cost seconds.
class FashionMnist : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new LoadedData(load_dataset(parse_data_spec("fashion-mnist"), {}));
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }
  static LoadedData* data_;
};
LoadedData* FashionMnist::data_ = nullptr;

TEST_F(FashionMnist, SizesShapesAndLabels) {
  ASSERT_TRUE(data_->test.has_value());
  EXPECT_EQ(data_->train.size(), 60000);
  EXPECT_EQ(data_->test->size(), 10000);
  EXPECT_EQ(data_->train.example_shape(), (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(data_->train.num_classes(), 10);
  EXPECT_EQ(data_->test->num_classes(), 10);
  EXPECT_TRUE(data_->train.is_pixels());
  std::vector<int64_t> count(10, 0);
  for (int64_t i = 0; i < data_->train.size(); ++i) {
    int64_t l = data_->train.label(i);
    ASSERT_TRUE(l >= 0 && l < 10) << l;
    ++count[static_cast<size_t>(l)];
  }
  for (int64_t c : count) EXPECT_EQ(c, 6000);  // fashion-mnist is balanced
}

TEST_F(FashionMnist, MatchesTheFileBytes) {
  std::vector<uint8_t> labels =
      testing::gunzip_file(std::string(kFashionDir) + "/train-labels-idx1-ubyte.gz");
  // Only the first three images: the loader already decompressed all 60000 once.
  std::vector<uint8_t> images =
      testing::gunzip_file(std::string(kFashionDir) + "/train-images-idx3-ubyte.gz", 16 + 3 * 784);
  ASSERT_EQ(labels.size(), 8u + 60000u);
  ASSERT_EQ(images.size(), 16u + 3u * 784u);
  EXPECT_EQ(data_->train.label(0), labels[8]);  // 9 (ankle boot) in the published file
  EXPECT_EQ(data_->train.label(59999), labels[8 + 59999]);
  std::vector<float> x(784);
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{2}}) {
    data_->train.read_example(i, x.data());
    for (size_t j = 0; j < 784; ++j)
      ASSERT_FLOAT_EQ(x[j], images[16 + static_cast<size_t>(i) * 784 + j] / 255.0f)
          << i << "," << j;
  }
}

TEST_F(FashionMnist, DefaultNormalization) {
  std::vector<uint8_t> images =
      testing::gunzip_file(std::string(kFashionDir) + "/t10k-images-idx3-ubyte.gz", 16 + 8 * 784);
  InputAdapter adapter = InputAdapter::for_dataset(*data_->test, std::vector<int64_t>{784});
  std::vector<float> x(784), y(784);
  data_->test->read_example(7, x.data());
  adapter.apply(x.data(), y.data());
  for (size_t j = 0; j < 784; ++j) {
    double want = (images[16 + 7 * 784 + j] / 255.0 - 0.2860) / 0.3530;
    ASSERT_NEAR(y[j], want, 1e-5) << j;
  }
}

// A small mnist:DIR with a t10k split (plain train files, gzip test files).
TEST(MnistDir, TestSplitIsTheDefaultValidation) {
  ScratchDir dir("mnistdir");
  std::vector<uint8_t> px(5 * 2 * 3);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 7);
  testing::write_bytes(dir.file("train-images-idx3-ubyte"), testing::idx_bytes({5, 2, 3}, px));
  testing::write_bytes(dir.file("train-labels-idx1-ubyte"),
                       testing::idx_bytes({5}, {3, 1, 4, 1, 5}));
  testing::write_bytes(
      dir.file("t10k-images-idx3-ubyte.gz"),
      testing::gzip_bytes(testing::idx_bytes({2, 2, 3}, {px.begin(), px.begin() + 12})));
  testing::write_bytes(dir.file("t10k-labels-idx1-ubyte.gz"),
                       testing::gzip_bytes(testing::idx_bytes({2}, {2, 6})));
  std::string spec = "mnist:" + dir.path().string();
  TrainValData tv = load_train_val({spec, "", 0, 1}, {});
  ASSERT_TRUE(tv.val.has_value());
  EXPECT_EQ(tv.train.size(), 5);
  EXPECT_EQ(tv.train.example_shape(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(tv.train.num_classes(), 6);
  EXPECT_EQ(tv.train.label(2), 4);
  ASSERT_EQ(tv.val->size(), 2);
  EXPECT_EQ(tv.val->label(1), 6);
  std::vector<float> x(6);
  tv.val->read_example(1, x.data());
  for (size_t j = 0; j < 6; ++j) EXPECT_FLOAT_EQ(x[j], px[6 + j] / 255.0f);
  EXPECT_FLOAT_EQ(tv.train.default_normalization().mean.at(0), 0.1307f);
  EXPECT_FALSE(load_train_val({spec, "none", 0, 1}, {}).val.has_value());
  // An explicit val spec wins; its test split is the validation set when it has one.
  TrainValData explicit_val = load_train_val({"synthetic:9", spec, 0, 1}, {{1, 2, 3}, 0, 0});
  EXPECT_EQ(explicit_val.val->size(), 2);
  std::string e = error_of([&] { load_train_val({spec, spec, 0.5, 1}, {}); });
  EXPECT_NE(e.find("not both"), std::string::npos) << e;
}

TEST(DataSpecTest, ParsesEveryKind) {
  EXPECT_EQ(parse_data_spec("fashion-mnist").dir, kFashionDir);
  EXPECT_EQ(parse_data_spec("fashion-mnist:/d").dir, "/d");
  EXPECT_EQ(parse_data_spec("mnist:/m").kind, DataSpec::Kind::kMnist);
  DataSpec npy = parse_data_spec("npy:a.npy,b.npy");
  EXPECT_EQ(npy.x_path, "a.npy");
  EXPECT_EQ(npy.y_path, "b.npy");
  EXPECT_EQ(parse_data_spec("images:/i").dir, "/i");
  EXPECT_EQ(parse_data_spec("synthetic:500").count, 500);
}

TEST(DataSpecTest, ClearErrors) {
  std::string e = error_of([] { parse_data_spec("cifar:/x"); });
  EXPECT_NE(e.find("unknown kind 'cifar'"), std::string::npos) << e;
  EXPECT_NE(e.find("synthetic:N"), std::string::npos) << e;
  e = error_of([] { parse_data_spec("npy:a.npy"); });
  EXPECT_NE(e.find("npy:X.npy,Y.npy"), std::string::npos) << e;
  e = error_of([] { parse_data_spec("synthetic:12x"); });
  EXPECT_NE(e.find("positive integer"), std::string::npos) << e;
  error_of([] { parse_data_spec("synthetic:0"); });
  error_of([] { parse_data_spec("mnist"); });
  e = error_of([] { load_dataset(parse_data_spec("mnist:/nonexistent/dir"), {}); });
  EXPECT_NE(e.find("/nonexistent/dir"), std::string::npos) << e;
}

TEST(NpyData, UsedAsStoredWithLabelsOrTargets) {
  ScratchDir dir("npy");
  std::vector<float> xs(6 * 4);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i) * 0.5f - 3.0f;
  write_npy(dir.file("x.npy"), graph::Tensor::from_vector(graph::DataType::kFloat, {6, 4}, xs));
  write_npy(dir.file("y.npy"), graph::Tensor::from_vector(graph::DataType::kInt32, {6},
                                                          std::vector<int32_t>{0, 4, 1, 1, 2, 0}));
  write_npy(dir.file("t.npy"), graph::Tensor::from_vector(graph::DataType::kFloat, {6, 2}, xs));
  LoadedData d =
      load_dataset(parse_data_spec("npy:" + dir.file("x.npy") + "," + dir.file("y.npy")), {});
  ASSERT_EQ(d.train.size(), 6);
  EXPECT_EQ(d.train.example_shape(), (std::vector<int64_t>{4}));
  EXPECT_EQ(d.train.num_classes(), 5);
  EXPECT_EQ(d.train.label(1), 4);
  EXPECT_TRUE(d.train.default_normalization().empty());
  InputAdapter a = InputAdapter::for_dataset(d.train, std::vector<int64_t>{4});
  std::vector<float> x(4), y(4);
  d.train.read_example(2, x.data());
  a.apply(x.data(), y.data());
  for (size_t j = 0; j < 4; ++j) EXPECT_EQ(y[j], xs[8 + j]);  // no scaling, no normalization

  LoadedData t =
      load_dataset(parse_data_spec("npy:" + dir.file("x.npy") + "," + dir.file("t.npy")), {});
  EXPECT_FALSE(t.train.has_labels());
  EXPECT_EQ(t.train.target_numel(), 2);
  std::vector<float> target(2);
  t.train.read_target(3, target.data());
  EXPECT_EQ(target[0], xs[6]);
  EXPECT_EQ(target[1], xs[7]);
}

TEST(NpyData, Errors) {
  ScratchDir dir("npyerr");
  write_npy(dir.file("x.npy"), graph::Tensor(graph::DataType::kFloat, {3, 2}));
  write_npy(dir.file("xi.npy"), graph::Tensor(graph::DataType::kInt16, {3, 2}));
  write_npy(dir.file("y2.npy"), graph::Tensor(graph::DataType::kInt64, {2}));
  write_npy(dir.file("yneg.npy"), graph::Tensor::from_vector(graph::DataType::kInt64, {3},
                                                             std::vector<int64_t>{0, -1, 2}));
  write_npy(dir.file("y.npy"), graph::Tensor(graph::DataType::kInt64, {3}));
  auto load = [&](const std::string& x, const std::string& y) {
    load_dataset(parse_data_spec("npy:" + dir.file(x) + "," + dir.file(y)), {});
  };
  std::string e = error_of([&] { load("x.npy", "y2.npy"); });
  EXPECT_NE(e.find("y2.npy"), std::string::npos) << e;
  e = error_of([&] { load("x.npy", "yneg.npy"); });
  EXPECT_NE(e.find("yneg.npy: label -1 at index 1"), std::string::npos) << e;
  e = error_of([&] { load("xi.npy", "y.npy"); });
  EXPECT_NE(e.find("xi.npy: features must be float32"), std::string::npos) << e;
}

TEST(ImageFolder, PngAndJpegClassesInSortedOrder) {
  ScratchDir dir("images");
  std::filesystem::create_directories(dir.path() / "b_dog");
  std::filesystem::create_directories(dir.path() / "a_cat");
  // a_cat/0.png: RGB 3x2 with distinct values; a_cat/1.png: gray (replicated to RGB);
  // b_dog/0.jpg: a flat color (JPEG keeps a flat block nearly exact).
  std::vector<uint8_t> rgb(2 * 3 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 13);
  testing::write_png(dir.file("a_cat/0.png"), 3, 2, 3, rgb);
  testing::write_png(dir.file("a_cat/1.png"), 3, 2, 1, {10, 20, 30, 40, 50, 60});
  std::vector<uint8_t> flat;
  for (int i = 0; i < 6; ++i) flat.insert(flat.end(), {200, 100, 50});
  testing::write_jpeg(dir.file("b_dog/0.jpg"), 3, 2, 3, flat);
  testing::write_bytes(dir.file("a_cat/notes.txt"), {'x'});  // ignored: not an image name

  LoadedData d = load_dataset(parse_data_spec("images:" + dir.path().string()), {});
  ASSERT_EQ(d.train.size(), 3);
  EXPECT_EQ(d.train.example_shape(), (std::vector<int64_t>{3, 2, 3}));
  EXPECT_EQ(d.train.num_classes(), 2);
  EXPECT_EQ(d.train.label(0), 0);
  EXPECT_EQ(d.train.label(1), 0);
  EXPECT_EQ(d.train.label(2), 1);
  EXPECT_EQ(d.train.default_normalization().mean.size(), 3u);  // ImageNet defaults for RGB
  std::vector<float> x(18);
  d.train.read_example(0, x.data());
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 6; ++p) EXPECT_FLOAT_EQ(x[c * 6 + p], rgb[p * 3 + c] / 255.0f);  // CHW
  d.train.read_example(1, x.data());
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 6; ++p) EXPECT_FLOAT_EQ(x[c * 6 + p], (10 + 10 * p) / 255.0f);
  // The RGB PNG into a grayscale model at twice the size, without normalization: luma of the
  // file's pixels, then bilinear 2x upsampling (corner pixels keep their value).
  InputAdapter to_gray =
      InputAdapter::for_dataset(d.train, std::vector<int64_t>{1, 4, 6}, Normalization{});
  std::vector<float> rgb_example(18), gray(24);
  d.train.read_example(0, rgb_example.data());
  to_gray.apply(rgb_example.data(), gray.data());
  auto luma = [&](int p) {
    return (0.299 * rgb[p * 3] + 0.587 * rgb[p * 3 + 1] + 0.114 * rgb[p * 3 + 2]) / 255.0;
  };
  EXPECT_NEAR(gray[0], luma(0), 1e-5);
  EXPECT_NEAR(gray[5], luma(2), 1e-5);
  EXPECT_NEAR(gray[18], luma(3), 1e-5);
  EXPECT_NEAR(gray[23], luma(5), 1e-5);
  // Output (1,1): source (0.25, 0.25) between pixels 0,1 (row 0) and 3,4 (row 1).
  EXPECT_NEAR(gray[7], 0.5625 * luma(0) + 0.1875 * luma(1) + 0.1875 * luma(3) + 0.0625 * luma(4),
              1e-5);
  d.train.read_example(2, x.data());
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 6; ++p)
      EXPECT_NEAR(x[c * 6 + p] * 255.0f, (std::vector<float>{200, 100, 50}[c]), 3.0f);
}

TEST(ImageFolder, MixedSizesNeedAModelShape) {
  ScratchDir dir("mixed");
  std::filesystem::create_directories(dir.path() / "c0");
  testing::write_png(dir.file("c0/a.png"), 2, 2, 1, {0, 255, 0, 255});
  testing::write_png(dir.file("c0/b.png"), 4, 4, 1, std::vector<uint8_t>(16, 128));
  std::string e =
      error_of([&] { load_dataset(parse_data_spec("images:" + dir.path().string()), {}); });
  EXPECT_NE(e.find("b.png: image is 4x4 but"), std::string::npos) << e;
  LoadOptions o;
  o.model_input = {1, 4, 4};
  LoadedData d = load_dataset(parse_data_spec("images:" + dir.path().string()), o);
  EXPECT_TRUE(d.train.is_image_files());  // an image model input: streamed, decoded per batch
  EXPECT_EQ(d.train.example_shape(), (std::vector<int64_t>{1, 4, 4}));
  EXPECT_TRUE(d.train.default_normalization().empty());  // grayscale input: none
  std::vector<float> x(16);
  // The validation geometry: 2x2 scaled by (4/2)/0.875 to 5x5, then the top-left-centered
  // 4x4 crop (offset (5-4)/2 = 0).
  std::vector<float> src = {0, 1, 0, 1}, big(25);
  resize_bilinear(src.data(), 1, 2, 2, big.data(), 5, 5);
  d.train.read_example(0, x.data());
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_FLOAT_EQ(x[r * 4 + c], big[r * 5 + c]) << r << "," << c;
  d.train.read_example(1, x.data());  // already 4x4: as is
  for (float v : x) EXPECT_FLOAT_EQ(v, 128 / 255.0f);
}

TEST(Synthetic, DeterministicPerSeedWithLabelsInRange) {
  LoadOptions o;
  o.model_input = {3, 4, 4};
  o.num_classes = 7;
  o.seed = 11;
  LoadedData a = load_dataset(parse_data_spec("synthetic:200"), o);
  LoadedData b = load_dataset(parse_data_spec("synthetic:200"), o);
  o.seed = 12;
  LoadedData c = load_dataset(parse_data_spec("synthetic:200"), o);
  ASSERT_EQ(a.train.size(), 200);
  EXPECT_EQ(a.train.example_shape(), o.model_input);
  std::set<int64_t> seen;
  bool differs = false;
  std::vector<float> xa(48), xb(48), xc(48);
  for (int64_t i = 0; i < 200; ++i) {
    ASSERT_TRUE(a.train.label(i) >= 0 && a.train.label(i) < 7);
    seen.insert(a.train.label(i));
    EXPECT_EQ(a.train.label(i), b.train.label(i));
    a.train.read_example(i, xa.data());
    b.train.read_example(i, xb.data());
    c.train.read_example(i, xc.data());
    EXPECT_EQ(xa, xb);
    differs |= xa != xc;
  }
  EXPECT_EQ(seen.size(), 7u);
  EXPECT_TRUE(differs);
  EXPECT_TRUE(a.train.default_normalization().empty());
  error_of([] { load_dataset(parse_data_spec("synthetic:5"), {}); });  // no model shape
}

}  // namespace
}  // namespace onnxtrain::runtime
