// The streaming image transforms (augment.h). Geometry is computed as boxes first, so only the
// pixels a crop keeps are converted to float; the resize is transform.cc's resize_bilinear.
#include "runtime/data/augment.h"

#include <algorithm>
#include <cmath>

#include "graph/error.h"
#include "runtime/data/transform.h"

namespace onnxtrain::runtime {
namespace {

constexpr float kEvalCropFraction = 0.875f;
constexpr float kJitter = 0.4f;
// Far above any epoch stream (random.h) and the holdout/synthetic ones.
constexpr uint64_t kAugmentSeedMix = 0xA5A5F00DC0FFEE11ull;

float uniform(DataRng& rng, float lo, float hi) {
  return lo + (hi - lo) * rng.unit_float();
}

// Pixels of `box` as floats in [0,1]: (C, box.height, box.width).
std::vector<float> crop_to_float(const DecodedImage& img, const CropBox& box) {
  std::vector<float> out(static_cast<size_t>(img.channels * box.height * box.width));
  float* dst = out.data();
  for (int64_t c = 0; c < img.channels; ++c)
    for (int64_t y = 0; y < box.height; ++y) {
      const uint8_t* row =
          img.chw.data() + (c * img.height + box.top + y) * img.width + box.left;
      for (int64_t x = 0; x < box.width; ++x) *dst++ = static_cast<float>(row[x]) * (1.0f / 255.0f);
    }
  return out;
}

float luma(const float* p, int64_t plane, int64_t i) {
  return 0.299f * p[i] + 0.587f * p[plane + i] + 0.114f * p[2 * plane + i];
}

void blend(float* p, int64_t n, float factor, float other) {
  for (int64_t i = 0; i < n; ++i) p[i] = std::clamp(factor * p[i] + (1 - factor) * other, 0.f, 1.f);
}

}  // namespace

std::optional<Augment> parse_augment(const std::string& text) {
  if (text == "none") return Augment::kNone;
  if (text == "basic") return Augment::kBasic;
  if (text == "imagenet") return Augment::kImageNet;
  return std::nullopt;
}

const char* augment_name(Augment a) {
  switch (a) {
    case Augment::kNone: return "none";
    case Augment::kBasic: return "basic";
    case Augment::kImageNet: return "imagenet";
  }
  return "?";
}

std::optional<OnBadImage> parse_on_bad_image(const std::string& text) {
  if (text == "stop") return OnBadImage::kStop;
  if (text == "skip") return OnBadImage::kSkip;
  return std::nullopt;
}

CropBox random_resized_crop_box(int64_t height, int64_t width, DataRng& rng) {
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const float log_lo = std::log(3.0f / 4.0f), log_hi = std::log(4.0f / 3.0f);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * uniform(rng, 0.08f, 1.0f);
    const double ratio = std::exp(uniform(rng, log_lo, log_hi));
    const auto w = static_cast<int64_t>(std::llround(std::sqrt(target * ratio)));
    const auto h = static_cast<int64_t>(std::llround(std::sqrt(target / ratio)));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      const auto top = static_cast<int64_t>(rng.below(static_cast<uint64_t>(height - h + 1)));
      const auto left = static_cast<int64_t>(rng.below(static_cast<uint64_t>(width - w + 1)));
      return {top, left, h, w};
    }
  }
  // Fallback: the whole image, clamped to the ratio range, centered.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < 3.0 / 4.0)
    h = std::clamp<int64_t>(std::llround(static_cast<double>(w) / (3.0 / 4.0)), 1, height);
  else if (in_ratio > 4.0 / 3.0)
    w = std::clamp<int64_t>(std::llround(static_cast<double>(h) * (4.0 / 3.0)), 1, width);
  return {(height - h) / 2, (width - w) / 2, h, w};
}

std::pair<int64_t, int64_t> eval_resize_dims(int64_t height, int64_t width, int64_t out_height,
                                             int64_t out_width) {
  if (height == out_height && width == out_width) return {height, width};
  const double scale = std::max(static_cast<double>(out_height) / static_cast<double>(height),
                                static_cast<double>(out_width) / static_cast<double>(width)) /
                       kEvalCropFraction;
  const int64_t rh = std::max(out_height, static_cast<int64_t>(std::llround(height * scale)));
  const int64_t rw = std::max(out_width, static_cast<int64_t>(std::llround(width * scale)));
  return {rh, rw};
}

CropBox center_crop_box(int64_t height, int64_t width, int64_t out_height, int64_t out_width) {
  OT_CHECK(out_height <= height && out_width <= width, "center crop ", out_height, "x", out_width,
           " of a ", height, "x", width, " image");
  return {(height - out_height) / 2, (width - out_width) / 2, out_height, out_width};
}

void flip_horizontal(float* chw, int64_t channels, int64_t height, int64_t width) {
  for (int64_t r = 0; r < channels * height; ++r) std::reverse(chw + r * width, chw + (r + 1) * width);
}

JitterFactors draw_jitter(DataRng& rng) {
  JitterFactors f;
  f.brightness = uniform(rng, 1 - kJitter, 1 + kJitter);
  f.contrast = uniform(rng, 1 - kJitter, 1 + kJitter);
  f.saturation = uniform(rng, 1 - kJitter, 1 + kJitter);
  std::vector<int> order{0, 1, 2};
  shuffle_with(order, rng);
  std::copy(order.begin(), order.end(), f.order);
  return f;
}

void color_jitter(float* chw, int64_t channels, int64_t pixels, const JitterFactors& f) {
  const int64_t n = channels * pixels;
  for (int op : f.order) {
    if (op == 0) {
      blend(chw, n, f.brightness, 0.0f);
    } else if (op == 1) {
      double sum = 0;
      for (int64_t i = 0; i < pixels; ++i) sum += channels == 3 ? luma(chw, pixels, i) : chw[i];
      blend(chw, n, f.contrast, static_cast<float>(sum / static_cast<double>(pixels)));
    } else if (channels == 3) {
      for (int64_t i = 0; i < pixels; ++i) {
        const float g = luma(chw, pixels, i);
        for (int64_t c = 0; c < 3; ++c) {
          float& v = chw[c * pixels + i];
          v = std::clamp(f.saturation * v + (1 - f.saturation) * g, 0.f, 1.f);
        }
      }
    }
  }
}

DataRng example_rng(uint64_t seed, int64_t epoch, int64_t index) {
  return DataRng(seed ^ kAugmentSeedMix,
                 (static_cast<uint64_t>(epoch) << 40) ^ static_cast<uint64_t>(index));
}

void transform_image(const DecodedImage& img, const std::vector<int64_t>& out_shape,
                     Augment augment, DataRng* rng, float* out) {
  OT_CHECK(out_shape.size() == 3 && (out_shape[0] == 1 || out_shape[0] == 3),
           "transform_image: output shape must be (1|3,H,W)");
  const int64_t oc = out_shape[0], oh = out_shape[1], ow = out_shape[2], plane = oh * ow;
  const int64_t ic = img.channels;
  OT_CHECK(ic == 1 || ic == 3, "transform_image: ", ic, " channels");
  // Geometry at the image's own channel count into `geo` (ic, oh, ow).
  std::vector<float> geo(static_cast<size_t>(ic * plane));
  if (augment == Augment::kNone) {
    const auto [rh, rw] = eval_resize_dims(img.height, img.width, oh, ow);
    std::vector<float> all = crop_to_float(img, {0, 0, img.height, img.width});
    std::vector<float> resized;
    const float* src = all.data();
    if (rh != img.height || rw != img.width) {
      resized.resize(static_cast<size_t>(ic * rh * rw));
      resize_bilinear(all.data(), ic, img.height, img.width, resized.data(), rh, rw);
      src = resized.data();
    }
    const CropBox box = center_crop_box(rh, rw, oh, ow);
    for (int64_t c = 0; c < ic; ++c)
      for (int64_t y = 0; y < oh; ++y)
        std::copy_n(src + (c * rh + box.top + y) * rw + box.left, ow,
                    geo.data() + c * plane + y * ow);
  } else {
    OT_CHECK(rng != nullptr, "transform_image: augmentation needs random numbers");
    const CropBox box = random_resized_crop_box(img.height, img.width, *rng);
    std::vector<float> crop = crop_to_float(img, box);
    resize_bilinear(crop.data(), ic, box.height, box.width, geo.data(), oh, ow);
  }
  // Channels at the output size: replicate gray, or BT.601 luma of RGB.
  if (ic == oc)
    std::copy(geo.begin(), geo.end(), out);
  else if (ic == 1)
    for (int64_t c = 0; c < oc; ++c) std::copy_n(geo.data(), plane, out + c * plane);
  else
    rgb_to_luma(geo.data(), plane, out);
  if (augment == Augment::kNone) return;
  if (rng->unit_float() < 0.5f) flip_horizontal(out, oc, oh, ow);
  if (augment == Augment::kImageNet) color_jitter(out, oc, plane, draw_jitter(*rng));
}

}  // namespace onnxtrain::runtime
