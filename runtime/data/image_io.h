// Decoding image files for images:DIR: JPEG (libturbojpeg) and PNG (libpng), chosen by the
// file's magic bytes, to 8-bit CHW with 1 (gray) or 3 (RGB) channels. Sizes are capped before
// anything is allocated; every error names the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace onnxtrain::runtime {

struct DecodedImage {
  int64_t channels = 0, height = 0, width = 0;
  std::vector<uint8_t> chw;  // channels x height x width
};

inline constexpr int64_t kMaxImageSide = 16384;
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;  // 64 Mpixel

// Gray (with or without alpha) stays 1 channel; palette, RGB and RGBA become RGB; alpha is
// dropped.
DecodedImage decode_image_file(const std::string& path);
// The file name's extension in lower case ("a/B.JPG" -> ".jpg"; "" without one).
std::string lower_extension(const std::string& name);
// True for names ending in .jpg/.jpeg/.png (any case).
bool is_image_file_name(const std::string& name);

}  // namespace onnxtrain::runtime
