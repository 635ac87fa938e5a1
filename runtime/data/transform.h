// Adapting dataset examples to the model's input: flatten/reshape, channel adaptation (1->3
// replicate, 3->1 luma), bilinear resize, and per-channel normalization.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/data/dataset.h"

namespace onnxtrain::runtime {

// src: (C,H,W) -> dst: (C,OH,OW). Half-pixel centers (PyTorch's align_corners=False, no
// antialiasing): source coordinate = (dst + 0.5) * in / out - 0.5, clamped to the image.
void resize_bilinear(const float* src, int64_t channels, int64_t height, int64_t width, float* dst,
                     int64_t out_height, int64_t out_width);
// rgb: (3,H,W) -> luma: (1,H,W), ITU-R BT.601 weights 0.299 R + 0.587 G + 0.114 B.
void rgb_to_luma(const float* rgb, int64_t pixels, float* luma);

// --mean / --std: comma-separated floats ("0.5" or "0.485,0.456,0.406"), both required.
Normalization parse_normalization(const std::string& mean, const std::string& std);

// Turns one example of `data_shape` into one model input of `model_shape`, in this order:
// channel adaptation, resize, normalization; the memory layout is CHW throughout, so a model
// that wants a vector of the same size (784 for (1,28,28)) gets the flattened image.
class InputAdapter {
 public:
  // Throws a one-line Error naming both shapes when they cannot be matched. `norm` values must
  // have one entry or one per output channel (`strict_norm`); otherwise (dataset defaults) a
  // per-channel default that does not fit collapses to its average.
  InputAdapter(std::vector<int64_t> data_shape, std::vector<int64_t> model_shape,
               Normalization norm, const std::string& data_name, bool strict_norm = true);
  // No adaptation: what named datasets (npz:) use, whose arrays feed the inputs as they are.
  InputAdapter() = default;
  // The dataset's default normalization unless `override` is given (an empty override turns
  // normalization off). A named dataset gets the default (no adaptation).
  static InputAdapter for_dataset(const Dataset& data, std::span<const int64_t> model_input,
                                  const std::optional<Normalization>& override = std::nullopt);

  const std::vector<int64_t>& output_shape() const { return model_shape_; }
  int64_t output_numel() const { return out_numel_; }
  // in: example_numel floats (pixels already in [0,1]) -> out: output_numel floats.
  void apply(const float* in, float* out) const;
  // "1->3 channels, resize 28x28->32x32, normalize mean=(0.286) std=(0.353)"; "" for identity.
  std::string describe() const;

 private:
  std::vector<int64_t> model_shape_;
  int64_t in_numel_ = 0, out_numel_ = 0;
  int64_t in_c_ = 1, in_h_ = 1, in_w_ = 1;  // data as an image (vectors: 1 x 1 x D)
  int64_t out_c_ = 1, out_h_ = 1, out_w_ = 1;
  bool adapt_ = false;                 // false: the output is the input, reshaped
  std::vector<float> mean_, inv_std_;  // one per output channel; empty = none
};

}  // namespace onnxtrain::runtime
