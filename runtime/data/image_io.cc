// JPEG and PNG decoding for images:DIR. Files come from users, so the header's size is checked
// against the caps before the pixel buffer exists, and decoder errors become one-line Errors.
#include "runtime/data/image_io.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "graph/error.h"

namespace onnxtrain::runtime {
namespace {

constexpr int64_t kMaxImageFileBytes = int64_t{256} << 20;

std::vector<unsigned char> read_file(const std::string& path) {
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  OT_CHECK(!ec, path, ": cannot read image: ", ec.message());
  OT_CHECK(static_cast<int64_t>(size) <= kMaxImageFileBytes, path, ": image file of ", size,
           " bytes exceeds the limit of ", kMaxImageFileBytes);
  std::ifstream in(path, std::ios::binary);
  OT_CHECK(in.good(), path, ": cannot open image: ", std::strerror(errno));
  std::vector<unsigned char> bytes(size);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  OT_CHECK(static_cast<size_t>(in.gcount()) == size, path, ": short read of the image file");
  return bytes;
}

void check_size(const std::string& path, int64_t width, int64_t height) {
  OT_CHECK(width > 0 && height > 0, path, ": image has size ", width, "x", height);
  OT_CHECK(width <= kMaxImageSide && height <= kMaxImageSide && width * height <= kMaxImagePixels,
           path, ": image of ", width, "x", height, " pixels exceeds the limit (", kMaxImageSide,
           " per side, ", kMaxImagePixels, " pixels)");
}

// HWC (interleaved) -> CHW (planar).
DecodedImage to_planar(const std::vector<unsigned char>& hwc, int64_t c, int64_t h, int64_t w) {
  DecodedImage img{c, h, w, std::vector<uint8_t>(static_cast<size_t>(c * h * w))};
  for (int64_t p = 0; p < h * w; ++p)
    for (int64_t k = 0; k < c; ++k) img.chw[k * h * w + p] = hwc[p * c + k];
  return img;
}

DecodedImage decode_jpeg(const std::string& path, const std::vector<unsigned char>& bytes) {
  struct Handle {
    tjhandle h = tjInitDecompress();
    ~Handle() {
      if (h) tjDestroy(h);
    }
  } tj;
  OT_CHECK(tj.h != nullptr, path, ": cannot create a JPEG decoder");
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.h, bytes.data(), static_cast<unsigned long>(bytes.size()), &width,
                          &height, &subsamp, &colorspace) != 0)
    fail(path, ": unreadable JPEG: ", tjGetErrorStr2(tj.h));
  check_size(path, width, height);
  bool gray = colorspace == TJCS_GRAY;
  int64_t c = gray ? 1 : 3;
  std::vector<unsigned char> hwc(static_cast<size_t>(c * width * height));
  // Corrupt-data warnings (a truncated scan) count as errors: the pixels would be garbage.
  if (tjDecompress2(tj.h, bytes.data(), static_cast<unsigned long>(bytes.size()), hwc.data(), width,
                    0, height, gray ? TJPF_GRAY : TJPF_RGB, 0) != 0)
    fail(path, ": unreadable JPEG: ", tjGetErrorStr2(tj.h));
  return to_planar(hwc, c, height, width);
}

DecodedImage decode_png(const std::string& path, const std::vector<unsigned char>& bytes) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()))
    fail(path, ": unreadable PNG: ", image.message);
  struct Guard {
    png_image* p;
    ~Guard() { png_image_free(p); }
  } guard{&image};
  check_size(path, image.width, image.height);
  bool gray = (image.format & PNG_FORMAT_FLAG_COLOR) == 0;
  image.format = gray ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  int64_t c = gray ? 1 : 3;
  std::vector<unsigned char> hwc(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, hwc.data(), 0, nullptr))
    fail(path, ": unreadable PNG: ", image.message);
  return to_planar(hwc, c, image.height, image.width);
}

}  // namespace

std::string lower_extension(const std::string& name) {
  std::string ext = std::filesystem::path(name).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return ext;
}

bool is_image_file_name(const std::string& name) {
  const std::string ext = lower_extension(name);
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

DecodedImage decode_image_file(const std::string& path) {
  std::vector<unsigned char> bytes = read_file(path);
  static constexpr unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return decode_png(path, bytes);
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF)
    return decode_jpeg(path, bytes);
  fail(path, ": unreadable image: neither a JPEG (FF D8 FF) nor a PNG signature at offset 0");
}

}  // namespace onnxtrain::runtime
