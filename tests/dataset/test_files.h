// Helpers for the dataset tests: a scratch folder, and writers for IDX (plain or gzip), PNG and
// JPEG files built with zlib / libpng / libturbojpeg directly, independent of the code tested.
#pragma once

#include <gtest/gtest.h>
#include <png.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/error.h"

namespace onnxtrain::runtime::testing {

namespace fs = std::filesystem;

// A fresh folder under the temp dir, removed when the object goes away.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    path_ =
        fs::temp_directory_path() / ("onnxtrain_dataset_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The first `limit` bytes (default: all) of a gzip file, via zlib.
inline std::vector<uint8_t> gunzip_file(const std::string& path, size_t limit = SIZE_MAX) {
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  std::vector<uint8_t> out;
  if (!f) return out;
  uint8_t buf[1 << 16];
  int n;
  while (out.size() < limit &&
         (n = gzread(f, buf, static_cast<unsigned>(std::min(sizeof buf, limit - out.size())))) > 0)
    out.insert(out.end(), buf, buf + n);
  gzclose(f);
  return out;
}

inline std::vector<uint8_t> gzip_bytes(const std::vector<uint8_t>& data) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> out(deflateBound(&zs, data.size()) + 64);
  zs.next_in = const_cast<Bytef*>(data.data());
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// IDX bytes: 0,0,0x08,rank, big-endian u32 dims, then the data.
inline std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims,
                                      const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(d >> s));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// HWC 8-bit pixels, 1 or 3 channels.
inline void write_png(const std::string& path, int width, int height, int channels,
                      const std::vector<uint8_t>& hwc) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  ASSERT_TRUE(png_image_write_to_file(&image, path.c_str(), 0, hwc.data(), 0, nullptr))
      << path << ": " << image.message;
}

inline void write_jpeg(const std::string& path, int width, int height, int channels,
                       const std::vector<uint8_t>& hwc) {
  tjhandle tj = tjInitCompress();
  ASSERT_NE(tj, nullptr);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  int rc = tjCompress2(tj, hwc.data(), width, 0, height, channels == 1 ? TJPF_GRAY : TJPF_RGB, &buf,
                       &size, channels == 1 ? TJSAMP_GRAY : TJSAMP_444, 100, 0);
  ASSERT_EQ(rc, 0) << tjGetErrorStr2(tj);
  write_bytes(path, std::vector<uint8_t>(buf, buf + size));
  tjFree(buf);
  tjDestroy(tj);
}

// Runs fn and returns the Error message ("" and a test failure when nothing is thrown).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line error: " << msg;
    return msg;
  }
  ADD_FAILURE() << "expected an onnxtrain::Error";
  return "";
}

}  // namespace onnxtrain::runtime::testing
