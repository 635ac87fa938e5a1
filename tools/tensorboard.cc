// TensorBoard event files (tensorboard.h).
#include "tools/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>

#include "graph/error.h"

namespace onnxtrain::tools {

namespace {

namespace fs = std::filesystem;

constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32c = crc32c_table();

// Protocol buffer wire format: varint, a key (field << 3 | wire type), fixed 32/64 bits.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire) { varint(out, static_cast<uint64_t>(field << 3 | wire)); }
template <typename T>
void fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little endian on every host this builds for
  out.append(b, sizeof(T));
}
void bytes_field(std::string& out, int field, std::string_view v) {
  key(out, field, 2);
  varint(out, v.size());
  out.append(v);
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
// summary = 5 (Summary: repeated Value value = 1; Value: tag = 1, simple_value = 2 (float)).
std::string event(int64_t step) {
  std::string e;
  key(e, 1, 1);
  fixed(e, wall_time());
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) c = kCrc32c[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventFile::EventFile(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  OT_CHECK(fs::is_directory(dir), "--tensorboard '", dir, "': cannot create the folder",
           ec ? cat(": ", ec.message()) : "");
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const auto seconds = static_cast<int64_t>(wall_time());
  // A resumed run (or a second one within the same second) gets its own file; TensorBoard
  // reads every file of the folder.
  for (int k = 0;; ++k) {
    path_ = (fs::path(dir) / cat("events.out.tfevents.", seconds, ".", host, ".", getpid(),
                                 k ? cat(".", k) : std::string(), ".onnxtrain"))
                .string();
    if (!fs::exists(path_)) break;
  }
  f_ = std::fopen(path_.c_str(), "wb");
  OT_CHECK(f_, "--tensorboard: cannot create '", path_, "': ", std::strerror(errno));
  std::string e = event(0);
  bytes_field(e, 3, "brain.Event:2");
  record(e);
  flush();
}

EventFile::~EventFile() {
  if (f_) std::fclose(f_);
}

void EventFile::record(const std::string& e) {
  std::string r;
  fixed<uint64_t>(r, e.size());
  const uint32_t length_crc = masked_crc32c(r);
  fixed(r, length_crc);
  r += e;
  fixed(r, masked_crc32c(e));
  OT_CHECK(std::fwrite(r.data(), 1, r.size(), f_) == r.size(), "--tensorboard: cannot write '",
           path_, "': ", std::strerror(errno));
}

void EventFile::scalar(std::string_view tag, int64_t step, double value) {
  std::string v;
  bytes_field(v, 1, tag);
  key(v, 2, 5);
  fixed(v, static_cast<float>(value));
  std::string summary;
  bytes_field(summary, 1, v);
  std::string e = event(step);
  bytes_field(e, 5, summary);
  record(e);
}

void EventFile::flush() {
  OT_CHECK(std::fflush(f_) == 0, "--tensorboard: cannot write '", path_, "': ",
           std::strerror(errno));
}

EventFile& TensorBoardWriter::train() {
  if (!train_) train_ = std::make_unique<EventFile>((fs::path(dir_) / "train").string());
  return *train_;
}

EventFile& TensorBoardWriter::validation() {
  if (!validation_)
    validation_ = std::make_unique<EventFile>((fs::path(dir_) / "validation").string());
  return *validation_;
}

void TensorBoardWriter::flush() {
  if (train_) train_->flush();
  if (validation_) validation_->flush();
}

}  // namespace onnxtrain::tools
