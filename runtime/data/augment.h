// Per-example image transforms of the streaming images: source (images:DIR, images:FILE.csv):
// torchvision-style RandomResizedCrop + horizontal flip (+ ColorJitter) for training, and the
// resize-shorter-side + center-crop of validation, from one decoded image to the model's (C,H,W).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/data/image_io.h"
#include "runtime/data/random.h"

namespace onnxtrain::runtime {

// --augment: none (validation geometry) | basic (random-resized-crop + flip) | imagenet (basic +
// color jitter 0.4/0.4/0.4).
enum class Augment { kNone, kBasic, kImageNet };
// nullopt for any other name (the command line says what it expects).
std::optional<Augment> parse_augment(const std::string& text);
const char* augment_name(Augment a);

// --on-bad-image: stop (the decoder's one-line error naming the file) | skip (a substitute).
enum class OnBadImage { kStop, kSkip };
std::optional<OnBadImage> parse_on_bad_image(const std::string& text);  // nullopt: unknown

// How a loader turns listed image files into batches (LoaderOptions::images).
struct ImageStreamOptions {
  Augment augment = Augment::kNone;
  int workers = 1;  // decoding threads per loader, >= 1
  OnBadImage on_bad_image = OnBadImage::kStop;
  // Called (from any worker thread) with a one-line warning the first time each of the first
  // kNamedBadImages skipped files of a loader is met; null = silent. Batch::bad_images counts.
  std::function<void(const std::string&)> warn = nullptr;
};
inline constexpr int kNamedBadImages = 5;

// A crop in source pixels.
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
  bool operator==(const CropBox&) const = default;
};

// torchvision RandomResizedCrop.get_params: area fraction uniform in [0.08, 1], aspect ratio
// (w/h) log-uniform in [3/4, 4/3], 10 tries; then the center crop of the whole image clamped to
// that ratio range.
CropBox random_resized_crop_box(int64_t height, int64_t width, DataRng& rng);

// Validation geometry: the size (rh, rw) an image is resized to before its center (out_h,
// out_w) crop. The image is scaled by max(out_h / h, out_w / w) / 0.875 (for a square input:
// its shorter side becomes round(side / 0.875), as Resize(256) + CenterCrop(224)). An image
// already of the input's size is left as is (rh, rw) = (h, w): pre-sized datasets pass unchanged.
std::pair<int64_t, int64_t> eval_resize_dims(int64_t height, int64_t width, int64_t out_height,
                                             int64_t out_width);
// The centered (out_h, out_w) box of an (h, w) image (offsets rounded down).
CropBox center_crop_box(int64_t height, int64_t width, int64_t out_height, int64_t out_width);

// Mirrors every row of a (C,H,W) image.
void flip_horizontal(float* chw, int64_t channels, int64_t height, int64_t width);

// torchvision ColorJitter(0.4, 0.4, 0.4) on [0,1] pixels, factors uniform in [0.6, 1.4], the
// three applied in a random order, each clamped to [0,1]: brightness x*b; contrast
// c*x + (1-c)*mean(luma); saturation s*x + (1-s)*luma(pixel) (a no-op on one channel).
struct JitterFactors {
  float brightness = 1, contrast = 1, saturation = 1;
  int order[3] = {0, 1, 2};  // 0 brightness, 1 contrast, 2 saturation
};
JitterFactors draw_jitter(DataRng& rng);
void color_jitter(float* chw, int64_t channels, int64_t pixels, const JitterFactors& f);

// The random numbers of example `index` (storage index in the listed files) in epoch `epoch`:
// a pure function of (seed, epoch, index), so batches do not depend on worker count or order.
DataRng example_rng(uint64_t seed, int64_t epoch, int64_t index);

// One decoded image (1 or 3 channels) -> out: (C,H,W) floats in [0,1] for out_shape (C,H,W),
// C 1 or 3 (gray replicates to RGB, RGB becomes BT.601 luma). kNone: validation geometry
// (rng unused, may be null); kBasic/kImageNet draw crop, flip (p 0.5) and jitter from rng in
// that order.
void transform_image(const DecodedImage& img, const std::vector<int64_t>& out_shape,
                     Augment augment, DataRng* rng, float* out);

}  // namespace onnxtrain::runtime
