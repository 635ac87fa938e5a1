// The streaming images: source: listing (folders, CSV) and its errors, the transforms' geometry
// (random-resized-crop bounds, flip, validation center crop, jitter), determinism across worker
// counts and after a seek, bad-image skip/stop, per-process fill ranges, and the prefetch bound.
#include "runtime/data/image_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "runtime/data/augment.h"
#include "runtime/data/loader.h"
#include "tests/dataset/test_files.h"

namespace onnxtrain::runtime {
namespace {

using testing::error_of;
using testing::ScratchDir;

// An image whose pixels encode its number: value (seed * 37 + y * 11 + x * 5 + c * 70) % 256.
std::vector<uint8_t> pattern(int w, int h, int c, int seed) {
  std::vector<uint8_t> px(static_cast<size_t>(w * h * c));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k)
        px[static_cast<size_t>((y * w + x) * c + k)] =
            static_cast<uint8_t>((seed * 37 + y * 11 + x * 5 + k * 70) % 256);
  return px;
}

// `n` images in 3 class folders, mixed PNG/JPEG, gray/RGB, 12..31 px.
void write_folder(const ScratchDir& dir, int n) {
  for (int k = 0; k < 3; ++k) std::filesystem::create_directories(dir.path() / ("c" + std::to_string(k)));
  for (int i = 0; i < n; ++i) {
    const int w = 12 + (i * 7) % 20, h = 12 + (i * 5) % 20, c = i % 4 == 0 ? 1 : 3;
    const std::string name = "c" + std::to_string(i % 3) + "/" + std::to_string(1000 + i);
    if (i % 2)
      testing::write_jpeg(dir.file(name + ".jpg"), w, h, c, pattern(w, h, c, i));
    else
      testing::write_png(dir.file(name + ".png"), w, h, c, pattern(w, h, c, i));
  }
}

Dataset streamed(const std::string& spec, std::vector<int64_t> shape = {3, 16, 16}) {
  LoadOptions o;
  o.model_input = std::move(shape);
  return load_dataset(parse_data_spec(spec), o).train;
}

std::vector<Batch> batches(const Dataset& d, LoaderOptions o, int count, LoaderPosition at = {}) {
  DataLoader loader(d, InputAdapter::for_dataset(d, d.example_shape()), o, at);
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i) out.push_back(loader.next());
  return out;
}

bool same(const graph::Tensor& a, const graph::Tensor& b) {
  return a.dims() == b.dims() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(ImageTransforms, RandomResizedCropStaysInsideWithinScaleAndRatio) {
  for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{300, 400}, {500, 375}, {224, 224}}) {
    for (uint64_t i = 0; i < 2000; ++i) {
      DataRng rng(7, i);
      const CropBox b = random_resized_crop_box(h, w, rng);
      ASSERT_TRUE(b.top >= 0 && b.left >= 0 && b.height >= 1 && b.width >= 1);
      ASSERT_LE(b.top + b.height, h);
      ASSERT_LE(b.left + b.width, w);
      // Rounding to whole pixels moves area and ratio by at most a pixel per side.
      const double area = double(b.height) * double(b.width) / (double(h) * double(w));
      const double ratio = double(b.width) / double(b.height);
      EXPECT_GE(area, 0.08 * 0.97) << h << "x" << w << " try " << i;
      EXPECT_LE(area, 1.0);
      EXPECT_GE(ratio, 0.75 * 0.97) << b.height << "x" << b.width;
      EXPECT_LE(ratio, 4.0 / 3.0 * 1.03) << b.height << "x" << b.width;
    }
  }
  // No try fits a 10x1000 strip: the fallback is the centered crop at ratio 4/3.
  DataRng rng(1, 2);
  EXPECT_EQ(random_resized_crop_box(10, 1000, rng), (CropBox{0, 493, 10, 13}));
  // The same (seed, epoch, index) gives the same box; another index another.
  DataRng a = example_rng(5, 2, 17), b = example_rng(5, 2, 17), c = example_rng(5, 2, 18),
          d = example_rng(5, 3, 17);
  const CropBox ba = random_resized_crop_box(300, 400, a);
  EXPECT_EQ(ba, random_resized_crop_box(300, 400, b));
  EXPECT_NE(ba, random_resized_crop_box(300, 400, c));
  EXPECT_NE(ba, random_resized_crop_box(300, 400, d));
}

TEST(ImageTransforms, FlipMirrorsEveryRow) {
  std::vector<float> x(2 * 3 * 4);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  std::vector<float> f = x;
  flip_horizontal(f.data(), 2, 3, 4);
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(f[r * 4 + c], x[r * 4 + 3 - c]);
  flip_horizontal(f.data(), 2, 3, 4);
  EXPECT_EQ(f, x);
}

TEST(ImageTransforms, ValidationResizesShorterSideThenCentersTheCrop) {
  // torchvision Resize(256) + CenterCrop(224) on a 375x500 (HxW) image: 256x341, crop at (16,58).
  EXPECT_EQ(eval_resize_dims(375, 500, 224, 224), (std::pair<int64_t, int64_t>{256, 341}));
  EXPECT_EQ(center_crop_box(256, 341, 224, 224), (CropBox{16, 58, 224, 224}));
  EXPECT_EQ(eval_resize_dims(40, 30, 28, 28), (std::pair<int64_t, int64_t>{43, 32}));
  EXPECT_EQ(eval_resize_dims(28, 28, 28, 28), (std::pair<int64_t, int64_t>{28, 28}));  // as is
  // A 4x6 gray image into (1,4,6): unchanged, only scaled to [0,1]; into (3,4,6) replicated.
  DecodedImage img{1, 4, 6, {}};
  for (int i = 0; i < 24; ++i) img.chw.push_back(static_cast<uint8_t>(i * 10));
  std::vector<float> out(72);
  transform_image(img, {3, 4, 6}, Augment::kNone, nullptr, out.data());
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 24; ++i) EXPECT_FLOAT_EQ(out[c * 24 + i], i * 10 / 255.0f);
  // Into (1,2,2): scaled by max(2/4, 2/6)/0.875 to 2x3 (4 * 0.571 = 2.29 -> 2, 3.43 -> 3), the
  // center 2x2 is columns 0..1 (offset (3-2)/2 = 0) of the resized image.
  std::vector<float> all(6), small(4);
  std::vector<float> src(img.chw.begin(), img.chw.end());
  for (float& v : src) v /= 255.0f;
  resize_bilinear(src.data(), 1, 4, 6, all.data(), 2, 3);
  transform_image(img, {1, 2, 2}, Augment::kNone, nullptr, small.data());
  EXPECT_FLOAT_EQ(small[0], all[0]);
  EXPECT_FLOAT_EQ(small[1], all[1]);
  EXPECT_FLOAT_EQ(small[2], all[3]);
  EXPECT_FLOAT_EQ(small[3], all[4]);
}

TEST(ImageTransforms, ColorJitterFactors) {
  std::vector<float> rgb = {0.5f, 0.9f, 0.2f, 0.4f, 0.1f, 0.6f};  // 2 pixels, CHW
  JitterFactors f;
  f.brightness = 1.25f;
  std::vector<float> x = rgb;
  color_jitter(x.data(), 3, 2, f);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_FLOAT_EQ(x[i], std::min(1.0f, rgb[i] * 1.25f));
  f = {};
  f.saturation = 0;  // every channel becomes the pixel's luma
  x = rgb;
  color_jitter(x.data(), 3, 2, f);
  for (int p = 0; p < 2; ++p) {
    const float l = 0.299f * rgb[p] + 0.587f * rgb[2 + p] + 0.114f * rgb[4 + p];
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(x[c * 2 + p], l, 1e-6);
  }
  f = {};
  f.contrast = 0;  // every value becomes the image's mean luma
  x = rgb;
  color_jitter(x.data(), 3, 2, f);
  const float mean = (0.299f * (0.5f + 0.9f) + 0.587f * (0.2f + 0.4f) + 0.114f * (0.1f + 0.6f)) / 2;
  for (float v : x) EXPECT_NEAR(v, mean, 1e-6);
  DataRng rng(3, 4);
  const JitterFactors d = draw_jitter(rng);
  for (float v : {d.brightness, d.contrast, d.saturation}) EXPECT_TRUE(v >= 0.6f && v <= 1.4f);
}

TEST(ImageStream, ListsOnlyFilesUpFrontWithFolderLabels) {
  ScratchDir dir("stream_list");
  write_folder(dir, 12);
  Dataset d = streamed("images:" + dir.path().string());
  ASSERT_TRUE(d.is_image_files());
  EXPECT_EQ(d.size(), 12);
  EXPECT_EQ(d.num_classes(), 3);
  EXPECT_EQ(d.example_shape(), (std::vector<int64_t>{3, 16, 16}));
  EXPECT_EQ(d.default_normalization().mean.size(), 3u);  // ImageNet's for an RGB input
  EXPECT_TRUE(streamed("images:" + dir.path().string(), {1, 16, 16}).default_normalization().empty());
  // Sorted: c0 holds images 0,3,6,9 (as 1000, 1003, ...), c1 1,4,7,10, c2 2,5,8,11.
  EXPECT_NE(d.image_path(0).find("c0/1000.png"), std::string::npos);
  EXPECT_NE(d.image_path(4).find("c1/1001.jpg"), std::string::npos);
  EXPECT_EQ(d.label(0), 0);
  EXPECT_EQ(d.label(4), 1);
  EXPECT_EQ(d.label(11), 2);
  // A file removed after listing is found out when its batch is decoded, not before.
  std::filesystem::remove(d.image_path(5));
  LoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  DataLoader loader(d, InputAdapter::for_dataset(d, d.example_shape()), o);
  EXPECT_EQ(loader.next().inputs.dims(), (std::vector<int64_t>{4, 3, 16, 16}));
  const std::string e = error_of([&] { loader.next(); });
  EXPECT_NE(e.find("c1/1004.png: cannot read image"), std::string::npos) << e;
}

TEST(ImageStream, SameBatchesWithOneOrThreeWorkers) {
  ScratchDir dir("stream_workers");
  write_folder(dir, 30);
  Dataset d = streamed("images:" + dir.path().string());
  LoaderOptions o;
  o.batch_size = 8;
  o.seed = 3;
  o.images.augment = Augment::kImageNet;
  o.images.workers = 1;
  const std::vector<Batch> one = batches(d, o, 8);  // two epochs of 4 steps
  o.images.workers = 3;
  const std::vector<Batch> three = batches(d, o, 8);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one[i].indices, three[i].indices);
    EXPECT_TRUE(same(one[i].inputs, three[i].inputs)) << "batch " << i;
    EXPECT_TRUE(same(one[i].targets, three[i].targets)) << "batch " << i;
  }
  // Augmentation draws differ by epoch: example 0 looks different in epoch 0 and epoch 1.
  auto row_of = [&](const std::vector<Batch>& bs, int64_t epoch, int64_t index) {
    for (const Batch& b : bs)
      for (int64_t r = 0; r < b.size(); ++r)
        if (b.epoch == epoch && b.indices[r] == index) {
          const float* x = b.inputs.data_as<float>() + r * d.example_numel();
          return std::vector<float>(x, x + d.example_numel());
        }
    return std::vector<float>();
  };
  EXPECT_NE(row_of(one, 0, 0), row_of(one, 1, 0));
  // Without augmentation the epochs agree.
  o.images.augment = Augment::kNone;
  const std::vector<Batch> plain = batches(d, o, 8);
  EXPECT_EQ(row_of(plain, 0, 0), row_of(plain, 1, 0));
  EXPECT_NE(row_of(plain, 0, 0), row_of(one, 0, 0));
}

TEST(ImageStream, SeekedLoaderMatchesOneThatStepped) {
  ScratchDir dir("stream_seek");
  write_folder(dir, 21);
  Dataset d = streamed("images:" + dir.path().string());
  LoaderOptions o;
  o.batch_size = 5;  // 5 steps per epoch, the last one of 1
  o.seed = 9;
  o.images.augment = Augment::kBasic;
  o.images.workers = 2;
  const std::vector<Batch> walked = batches(d, o, 12);
  const std::vector<Batch> resumed = batches(d, o, 5, LoaderPosition{1, 2});  // batch 7 on
  for (size_t i = 0; i < resumed.size(); ++i) {
    const Batch& w = walked[7 + i];
    EXPECT_EQ(w.epoch, resumed[i].epoch);
    EXPECT_EQ(w.step, resumed[i].step);
    EXPECT_EQ(w.indices, resumed[i].indices);
    EXPECT_TRUE(same(w.inputs, resumed[i].inputs)) << "batch " << 7 + i;
  }
  DataLoader loader(d, InputAdapter::for_dataset(d, d.example_shape()), o);
  loader.next();
  loader.seek({2, 1});
  EXPECT_TRUE(same(loader.next().inputs, walked[11].inputs));
}

TEST(ImageStream, BadImageSkipUsesTheNextReadableOneAndCounts) {
  ScratchDir dir("stream_bad");
  write_folder(dir, 9);  // c0: 1000, 1003, 1006; c1: 1001, 1004, 1007; c2: ...
  testing::write_bytes(dir.file("c0/1003.jpg"), {'n', 'o', 'p', 'e'});
  Dataset d = streamed("images:" + dir.path().string());
  LoaderOptions o;
  o.batch_size = 9;
  o.shuffle = false;
  o.images.on_bad_image = OnBadImage::kSkip;
  o.images.workers = 2;
  std::mutex mu;
  std::vector<std::string> warnings;
  o.images.warn = [&](const std::string& m) {
    std::lock_guard lock(mu);
    warnings.push_back(m);
  };
  const Batch b = batches(d, o, 1)[0];
  EXPECT_EQ(b.bad_images, 1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("c0/1003.jpg: unreadable image"), std::string::npos) << warnings[0];
  // Row 1 (c0/1003.jpg) holds row 2's image (c0/1006.png) and label.
  const int64_t n = d.example_numel();
  const float* x = b.inputs.data_as<float>();
  EXPECT_TRUE(std::equal(x + n, x + 2 * n, x + 2 * n));
  EXPECT_EQ(b.targets.data_as<int64_t>()[1], 0);
  // The last row wraps around: a bad last file is replaced by the first.
  testing::write_bytes(dir.file("c2/1008.png"), {'b', 'a', 'd'});
  const Batch w = batches(d, o, 1)[0];
  EXPECT_EQ(w.bad_images, 2);
  EXPECT_TRUE(std::equal(x, x + n, w.inputs.data_as<float>() + 8 * n));
  EXPECT_EQ(w.targets.data_as<int64_t>()[8], 0);
  // stop (the default): the decoder's error naming the file.
  o.images.on_bad_image = OnBadImage::kStop;
  const std::string e = error_of([&] { batches(d, o, 1); });
  EXPECT_NE(e.find("c0/1003.jpg: unreadable image"), std::string::npos) << e;
}

TEST(ImageStream, FillRangeDecodesOnlyThoseRows) {
  ScratchDir dir("stream_fill");
  write_folder(dir, 10);
  Dataset d = streamed("images:" + dir.path().string());
  LoaderOptions o;
  o.batch_size = 10;
  o.images.augment = Augment::kBasic;
  const Batch all = batches(d, o, 1)[0];
  o.fill_parts = 4, o.fill_first = 1, o.fill_count = 2;  // rows of replicas 1, 2 of 4: [3, 8)
  const Batch part = batches(d, o, 1)[0];
  EXPECT_EQ(part.filled(), (std::pair<int64_t, int64_t>{3, 8}));
  EXPECT_EQ(part.inputs.dims()[0], 5);
  EXPECT_TRUE(same(part.targets, all.targets));  // labels of every row
  EXPECT_TRUE(same(part.rows(3, 5).inputs, all.rows(3, 5).inputs));
  EXPECT_TRUE(same(part.rows(5, 2).inputs, all.rows(5, 2).inputs));
  error_of([&] { part.rows(0, 4); });  // rows this process did not decode
  // The in-memory sources honour the range too.
  std::vector<float> xs(20);
  for (int i = 0; i < 20; ++i) xs[i] = static_cast<float>(i);
  Dataset mem = Dataset::from_floats("m", {2}, xs, std::vector<int64_t>(10, 1));
  o.shuffle = false;
  const Batch m = batches(mem, o, 1)[0];
  ASSERT_EQ(m.inputs.dims(), (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(m.inputs.data_as<float>()[0], 6.0f);
}

TEST(ImageStream, PrefetchBoundsTheDecodedBatches) {
  ScratchDir dir("stream_bound");
  write_folder(dir, 60);
  Dataset d = streamed("images:" + dir.path().string());
  std::atomic<int> made{0};
  LoaderOptions o;
  o.batch_size = 2;  // 30 batches per epoch
  o.prefetch = 3;
  o.images.workers = 2;
  BatchFn inner = dataset_batch_fn(d, InputAdapter::for_dataset(d, d.example_shape()), 0, o.images);
  DataLoader loader(d.size(), [&](std::span<const int64_t> idx, Batch& b) {
    inner(idx, b);
    ++made;
  }, o);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // The queue holds `prefetch` batches; the producer waits with at most one more built.
  EXPECT_LE(made.load(), o.prefetch + 1);
  EXPECT_GE(made.load(), o.prefetch);
  loader.next();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LE(made.load(), o.prefetch + 2);
}

TEST(ImageCsv, PathsLabelsAndErrorsNamingTheLine) {
  ScratchDir dir("stream_csv");
  write_folder(dir, 4);
  const std::string csv = dir.file("list.csv");
  auto write_csv = [&](const std::string& text) {
    testing::write_bytes(csv, std::vector<uint8_t>(text.begin(), text.end()));
  };
  write_csv("path,label\nc0/1000.png,4\n# comment\n\n" + dir.file("c1/1001.jpg") + ", 1\n");
  Dataset d = streamed("images:" + csv);
  ASSERT_EQ(d.size(), 2);
  EXPECT_EQ(d.num_classes(), 5);
  EXPECT_EQ(d.label(0), 4);
  EXPECT_EQ(d.image_path(0), dir.file("c0/1000.png"));  // relative to the CSV's folder
  std::vector<float> x(d.example_numel());
  d.read_example(1, x.data());  // decodes
  write_csv("c0/1000.png,0\nc0/missing.png,1\n");
  std::string e = error_of([&] { streamed("images:" + csv); });
  EXPECT_NE(e.find("list.csv:2: image file '" + dir.file("c0/missing.png") + "' not found"),
            std::string::npos)
      << e;
  write_csv("c0/1000.png,0\nc1/1001.jpg,cat\n");
  e = error_of([&] { streamed("images:" + csv); });
  EXPECT_NE(e.find("list.csv:2: label 'cat' is not a class index"), std::string::npos) << e;
  write_csv("c0/1000.png,-1\n");
  e = error_of([&] { streamed("images:" + csv); });
  EXPECT_NE(e.find("list.csv:1: label '-1'"), std::string::npos) << e;
  write_csv("c0/1000.png\n");
  e = error_of([&] { streamed("images:" + csv); });
  EXPECT_NE(e.find("list.csv:1: expected path,label"), std::string::npos) << e;
  write_csv("# nothing\n");
  e = error_of([&] { streamed("images:" + csv); });
  EXPECT_NE(e.find("list.csv: no images listed"), std::string::npos) << e;
  e = error_of([&] { streamed("images:" + dir.file("none.csv")); });
  EXPECT_NE(e.find("none.csv: CSV file not found"), std::string::npos) << e;
  // A CSV needs an image-shaped model input (no in-memory fallback).
  write_csv("c0/1000.png,0\n");
  e = error_of([&] { streamed("images:" + csv, {768}); });
  EXPECT_NE(e.find("needs a model input (C,H,W)"), std::string::npos) << e;
  // Folder errors: missing folder, empty class folder.
  e = error_of([&] { streamed("images:" + dir.file("nope")); });
  EXPECT_NE(e.find("nope: directory not found"), std::string::npos) << e;
  std::filesystem::create_directories(dir.path() / "c9");
  e = error_of([&] { streamed("images:" + dir.path().string()); });
  EXPECT_NE(e.find("c9: class folder has no .jpg/.jpeg/.png files"), std::string::npos) << e;
}

TEST(ImageStream, HoldoutSplitKeepsStreaming) {
  ScratchDir dir("stream_holdout");
  write_folder(dir, 20);
  LoadOptions lo;
  lo.model_input = {1, 16, 16};
  lo.num_classes = 3;
  TrainValData tv = load_train_val({"images:" + dir.path().string(), "", 0.25, 1}, lo);
  ASSERT_TRUE(tv.val.has_value());
  EXPECT_EQ(tv.train.size(), 15);
  EXPECT_EQ(tv.val->size(), 5);
  EXPECT_TRUE(tv.val->is_image_files());
  // Validation rows are example i of the view: same file, same pixels as the full list's.
  Dataset full = streamed("images:" + dir.path().string(), {1, 16, 16});
  const int64_t k = tv.val->storage_index(2);
  EXPECT_EQ(tv.val->image_path(2), full.image_path(k));
  LoaderOptions o;
  o.batch_size = 5;
  o.shuffle = false;
  const Batch v = batches(*tv.val, o, 1)[0];
  std::vector<float> x(256);
  full.read_example(k, x.data());
  EXPECT_TRUE(std::equal(x.begin(), x.end(), v.inputs.data_as<float>() + 2 * 256));
  EXPECT_EQ(v.targets.data_as<int64_t>()[2], full.label(k));
  lo.num_classes = 2;  // labels 0..2 do not fit a 2-class model
  const std::string e =
      error_of([&] { load_train_val({"images:" + dir.path().string(), "", 0, 1}, lo); });
  EXPECT_NE(e.find("label 2"), std::string::npos) << e;
}

}  // namespace
}  // namespace onnxtrain::runtime
