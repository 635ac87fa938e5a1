// InputAdapter and the image operations, on small hand-made images with hand-computed or
// float64 reference results.
#include "runtime/data/transform.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/dataset/test_files.h"

namespace onnxtrain::runtime {
namespace {

using testing::error_of;

std::vector<float> run(const InputAdapter& a, const std::vector<float>& in) {
  std::vector<float> out(static_cast<size_t>(a.output_numel()), -99.0f);
  a.apply(in.data(), out.data());
  return out;
}

TEST(Resize, UpsampleTwoByTwoByHand) {
  // [0 1; 2 3] -> 4x4 with half-pixel centers: source coords -0.25(->0), 0.25, 0.75, 1.25(->1).
  std::vector<float> src = {0, 1, 2, 3}, dst(16);
  resize_bilinear(src.data(), 1, 2, 2, dst.data(), 4, 4);
  std::vector<double> t = {0, 0.25, 0.75, 1};  // weight of the second row/column
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) {
      double want = (1 - t[y]) * ((1 - t[x]) * 0 + t[x] * 1) + t[y] * ((1 - t[x]) * 2 + t[x] * 3);
      EXPECT_NEAR(dst[y * 4 + x], want, 1e-6) << y << "," << x;
    }
  EXPECT_NEAR(dst[1 * 4 + 1], 0.75, 1e-6);  // 0.75*0.75*0 + ... worked out on paper
}

TEST(Resize, DownsampleByTwoAveragesBlocksAndSameSizeIsIdentity) {
  std::vector<float> src(2 * 4 * 4);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>((i * 37) % 11);
  std::vector<float> dst(2 * 2 * 2);
  resize_bilinear(src.data(), 2, 4, 4, dst.data(), 2, 2);
  for (int c = 0; c < 2; ++c)
    for (int y = 0; y < 2; ++y)
      for (int x = 0; x < 2; ++x) {
        const float* p = src.data() + c * 16 + (2 * y) * 4 + 2 * x;
        double avg = (p[0] + p[1] + p[4] + p[5]) / 4.0;
        EXPECT_NEAR(dst[c * 4 + y * 2 + x], avg, 1e-5);
      }
  std::vector<float> same(src.size());
  resize_bilinear(src.data(), 2, 4, 4, same.data(), 4, 4);
  EXPECT_EQ(same, src);
  // A constant image stays constant at any size.
  std::vector<float> flat(5 * 7, 0.3f), big(9 * 3);
  resize_bilinear(flat.data(), 1, 5, 7, big.data(), 9, 3);
  for (float v : big) EXPECT_NEAR(v, 0.3f, 1e-6);
}

TEST(Adapter, FlattenAndReshapeAreCopies) {
  std::vector<float> img(28 * 28);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<float>(i) / 784.0f;
  InputAdapter flat({1, 28, 28}, {784}, {}, "d");
  EXPECT_EQ(run(flat, img), img);
  EXPECT_EQ(flat.describe(), "");
  InputAdapter unflat({784}, {1, 28, 28}, {}, "d");
  EXPECT_EQ(run(unflat, img), img);
  InputAdapter same({1, 28, 28}, {1, 28, 28}, {}, "d");
  EXPECT_EQ(run(same, img), img);
}

TEST(Adapter, GrayToRgbReplicatesAndRgbToGrayIsLuma) {
  std::vector<float> gray = {0.1f, 0.2f, 0.3f, 0.4f};
  InputAdapter up({1, 2, 2}, {3, 2, 2}, {}, "d");
  std::vector<float> rgb = run(up, gray);
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 4; ++p) EXPECT_EQ(rgb[c * 4 + p], gray[p]);
  // R, G, B planes of a 1x2 image: pixel 0 pure red, pixel 1 (0.2, 0.4, 0.8).
  std::vector<float> color = {1.0f, 0.2f, 0.0f, 0.4f, 0.0f, 0.8f};
  InputAdapter down({3, 1, 2}, {1, 1, 2}, {}, "d");
  std::vector<float> luma = run(down, color);
  EXPECT_NEAR(luma[0], 0.299, 1e-6);
  EXPECT_NEAR(luma[1], 0.299 * 0.2 + 0.587 * 0.4 + 0.114 * 0.8, 1e-6);
  // Gray image into a flat RGB vector model (3*H*W values).
  InputAdapter to_vec({1, 2, 2}, {12}, {}, "d");
  EXPECT_EQ(run(to_vec, gray), rgb);
}

TEST(Adapter, ChannelsThenResizeThenNormalize) {
  // 1x2x2 gray -> 3x4x4 with per-channel mean/std: compare with a float64 reference of the
  // same three steps written out directly.
  std::vector<float> gray = {0.0f, 0.5f, 1.0f, 0.25f};
  Normalization n{{0.1f, 0.2f, 0.3f}, {0.5f, 0.25f, 2.0f}};
  InputAdapter a({1, 2, 2}, {3, 4, 4}, n, "d");
  EXPECT_EQ(a.describe(),
            "1->3 channels, resize 2x2->4x4, normalize mean=(0.1,0.2,0.3) std=(0.5,0.25,2)");
  std::vector<float> out = run(a, gray);
  std::vector<double> t = {0, 0.25, 0.75, 1};
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 4; ++x) {
        double v = (1 - t[y]) * ((1 - t[x]) * gray[0] + t[x] * gray[1]) +
                   t[y] * ((1 - t[x]) * gray[2] + t[x] * gray[3]);
        double want = (v - n.mean[c]) / n.std[c];
        EXPECT_NEAR(out[c * 16 + y * 4 + x], want, 1e-5) << c << "," << y << "," << x;
      }
}

TEST(Adapter, NormalizationMath) {
  std::vector<float> x = {0.0f, 0.25f, 0.5f, 1.0f, 0.75f, 0.125f};  // (2,1,3)
  InputAdapter one({2, 1, 3}, {2, 1, 3}, {{0.5f}, {0.25f}}, "d");
  std::vector<float> y = run(one, x);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], (x[i] - 0.5) / 0.25, 1e-6);
  InputAdapter per({2, 1, 3}, {6}, {{0.1f, 0.9f}, {1.0f, 0.5f}},
                   "d");  // channels kept when flattening
  y = run(per, x);
  for (size_t i = 0; i < 6; ++i) {
    double m = i < 3 ? 0.1 : 0.9, s = i < 3 ? 1.0 : 0.5;
    EXPECT_NEAR(y[i], (x[i] - m) / s, 1e-6) << i;
  }
  std::string e = error_of([] {
    InputAdapter({1, 2, 2}, {1, 2, 2}, {{0.1f, 0.2f, 0.3f}, {1.0f}}, "d");
  });
  EXPECT_NE(e.find("mean has 3 values but the model input has 1 channels"), std::string::npos) << e;
  e = error_of([] { InputAdapter({1, 2, 2}, {1, 2, 2}, {{0.1f}, {0.0f}}, "d"); });
  EXPECT_NE(e.find("std 0 must be > 0"), std::string::npos) << e;
  // Dataset defaults (not strict) that do not fit collapse to their average.
  InputAdapter loose({3, 1, 1}, {1, 1, 1}, {{0.2f, 0.4f, 0.6f}, {0.5f, 0.5f, 0.5f}}, "d", false);
  std::vector<float> rgb = {1.0f, 1.0f, 1.0f};
  EXPECT_NEAR(run(loose, rgb)[0], (1.0 - 0.4) / 0.5, 1e-5);
}

TEST(Adapter, ParseNormalization) {
  Normalization n = parse_normalization("0.485,0.456,0.406", "0.5");
  EXPECT_EQ(n.mean, (std::vector<float>{0.485f, 0.456f, 0.406f}));
  EXPECT_EQ(n.std, std::vector<float>{0.5f});
  std::string e = error_of([] { parse_normalization("0.1,,0.2", "1"); });
  EXPECT_NE(e.find("--mean '0.1,,0.2': '' is not a number"), std::string::npos) << e;
  e = error_of([] { parse_normalization("0.1", "1x"); });
  EXPECT_NE(e.find("--std '1x': '1x' is not a number"), std::string::npos) << e;
  error_of([] { parse_normalization("0.1", ""); });
  error_of([] { parse_normalization("nan", "1"); });
}

TEST(Adapter, MismatchNamesBothShapes) {
  std::string e = error_of([] { InputAdapter({1, 28, 28}, {100}, {}, "fashion-mnist (train)"); });
  EXPECT_NE(e.find("fashion-mnist (train)"), std::string::npos) << e;
  EXPECT_NE(e.find("(1,28,28)"), std::string::npos) << e;
  EXPECT_NE(e.find("(100)"), std::string::npos) << e;
  e = error_of([] { InputAdapter({2, 8, 8}, {3, 8, 8}, {}, "d"); });
  EXPECT_NE(e.find("2 channels cannot become 3"), std::string::npos) << e;
  e = error_of([] { InputAdapter({10}, {3, 4, 4}, {}, "d"); });
  EXPECT_NE(e.find("(10)"), std::string::npos) << e;
  e = error_of([] { InputAdapter({1, 4, 4}, {-1, 4, 4}, {}, "d"); });
  EXPECT_NE(e.find("(-1,4,4)"), std::string::npos) << e;
}

}  // namespace
}  // namespace onnxtrain::runtime
