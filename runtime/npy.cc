// NumPy .npy and ONNX TensorProto files <-> host tensors. Both arrive from users and test
// suites, so every length is checked against the file size before anything is allocated, and
// every error names the file (and, for .npy, the byte offset of the problem).
#include "runtime/npy.h"

#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>

#include "graph/error.h"
#include "graph/file_io.h"
#include "graph/onnx_io.h"

namespace onnxtrain::runtime {
namespace {

namespace fs = std::filesystem;
using graph::DataType;
using graph::Tensor;

static_assert(std::endian::native == std::endian::little,
              "npy.cc reads and writes little-endian data without swapping");

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kPreludeV1 = 10;                      // magic, version, u16 header length
constexpr size_t kPreludeV2 = 12;                      // magic, version, u32 header length
constexpr int64_t kMaxHeaderBytes = int64_t{1} << 20;  // numpy writes a few hundred bytes
constexpr size_t kMaxRank = 64;
constexpr int64_t kMaxPbBytes = (int64_t{2} << 30) - 1;  // protobuf's own message limit

// One row per supported element type, used in both directions.
struct NpyType {
  char kind;  // 'f', 'i', 'u', 'b'
  int size;   // bytes
  DataType dtype;
};
constexpr std::array<NpyType, 12> kNpyTypes = {{
    {'f', 4, DataType::kFloat},
    {'f', 8, DataType::kDouble},
    {'f', 2, DataType::kFloat16},
    {'i', 1, DataType::kInt8},
    {'i', 2, DataType::kInt16},
    {'i', 4, DataType::kInt32},
    {'i', 8, DataType::kInt64},
    {'u', 1, DataType::kUInt8},
    {'u', 2, DataType::kUInt16},
    {'u', 4, DataType::kUInt32},
    {'u', 8, DataType::kUInt64},
    {'b', 1, DataType::kBool},
}};

std::string errno_text() {
  return std::strerror(errno);
}

std::string shape_text(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  if (dims.size() == 1) s += ",";
  return s + ")";
}

// The header dictionary: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Parses the Python literal numpy writes. `base` is the header's file offset, for errors.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, size_t base, const std::string& file)
      : s_(text), base_(base), file_(file) {}

  NpyHeader parse() {
    NpyHeader h;
    bool have_descr = false, have_order = false, have_shape = false;
    skip_ws();
    expect('{');
    for (;;) {
      skip_ws();
      if (peek() == '}') break;
      size_t key_at = i_;
      std::string key = string_literal();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (peek() == '[') error("structured dtypes (a list 'descr') are not supported");
        h.descr = string_literal();
        have_descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = bool_literal();
        have_order = true;
      } else if (key == "shape") {
        h.shape = int_tuple();
        have_shape = true;
      } else {
        error_at(key_at, cat("unexpected key '", key, "'"));
      }
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != '}') error("expected ',' or '}'");
    }
    ++i_;
    skip_ws();
    if (i_ != s_.size()) error("unexpected characters after the header dictionary");
    if (!have_descr) error_at(0, "header has no 'descr'");
    if (!have_order) error_at(0, "header has no 'fortran_order'");
    if (!have_shape) error_at(0, "header has no 'shape'");
    return h;
  }

 private:
  [[noreturn]] void error_at(size_t pos, const std::string& what) const {
    fail(file_, ": .npy header at offset ", base_ + pos, ": ", what);
  }
  [[noreturn]] void error(const std::string& what) const { error_at(i_, what); }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  void expect(char c) {
    if (i_ >= s_.size()) error(cat("header ends where '", c, "' was expected"));
    if (s_[i_] != c) error(cat("expected '", c, "'"));
    ++i_;
  }
  std::string string_literal() {
    char q = peek();
    if (q != '\'' && q != '"') error("expected a quoted string");
    size_t start = ++i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\' || s_[i_] == '\n') error("unsupported character in a string");
      ++i_;
    }
    if (i_ >= s_.size()) error_at(start - 1, "unterminated string");
    std::string out(s_.substr(start, i_ - start));
    ++i_;
    return out;
  }
  bool bool_literal() {
    if (s_.substr(i_, 4) == "True") {
      i_ += 4;
      return true;
    }
    if (s_.substr(i_, 5) == "False") {
      i_ += 5;
      return false;
    }
    error("expected True or False");
  }
  int64_t int_literal() {
    if (peek() < '0' || peek() > '9') error("expected a non-negative integer");
    int64_t v = 0;
    size_t start = i_;
    while (peek() >= '0' && peek() <= '9') {
      if (__builtin_mul_overflow(v, int64_t{10}, &v) ||
          __builtin_add_overflow(v, int64_t{s_[i_] - '0'}, &v))
        error_at(start, "dimension does not fit in int64");
      ++i_;
    }
    if (peek() == 'L') ++i_;  // Python 2 long literal, written by old numpy
    return v;
  }
  std::vector<int64_t> int_tuple() {
    std::vector<int64_t> dims;
    expect('(');
    for (;;) {
      skip_ws();
      if (peek() == ')') break;
      if (dims.size() >= kMaxRank) error(cat("shape has more than ", kMaxRank, " dimensions"));
      dims.push_back(int_literal());
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != ')') error("expected ',' or ')' in the shape");
    }
    ++i_;
    return dims;
  }

  std::string_view s_;
  size_t i_ = 0;
  size_t base_;
  const std::string& file_;
};

// '<f4' -> kFloat. Refuses big-endian and types without a graph::DataType.
DataType dtype_from_descr(const std::string& descr, size_t offset, const std::string& file) {
  auto bad = [&](const std::string& why) {
    fail(file, ": .npy header at offset ", offset, ": dtype '", descr, "' ", why);
  };
  if (descr.size() < 3) bad("is not a simple numeric type");
  char order = descr[0];
  char kind = descr[1];
  int size = 0;
  for (size_t i = 2; i < descr.size(); ++i) {
    if (descr[i] < '0' || descr[i] > '9' || size > 1000) bad("is not a simple numeric type");
    size = size * 10 + (descr[i] - '0');
  }
  if (order != '<' && order != '>' && order != '|' && order != '=')
    bad("has no byte-order mark ('<', '>', '|' or '=')");
  if (order == '>' && size > 1)
    bad("is big-endian; convert it with arr.astype(arr.dtype.newbyteorder('<'))");
  for (const auto& row : kNpyTypes)
    if (row.kind == kind && row.size == size) return row.dtype;
  bad("is not supported (supported: f2 f4 f8 i1 i2 i4 i8 u1 u2 u4 u8 b1)");
  return DataType::kUndefined;  // not reached
}

std::optional<NpyType> npy_type_of(DataType dt) {
  for (const auto& row : kNpyTypes)
    if (row.dtype == dt) return row;
  return std::nullopt;
}

uint32_t read_le(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::ifstream open_for_read(const std::string& path, int64_t& size) {
  std::error_code ec;
  OT_CHECK(fs::exists(path, ec), path, ": file not found");
  OT_CHECK(!fs::is_directory(path, ec), path, ": is a directory, not a tensor file");
  std::ifstream in(path, std::ios::binary);
  OT_CHECK(in.good(), path, ": cannot open: ", errno_text());
  in.seekg(0, std::ios::end);
  size = static_cast<int64_t>(in.tellg());
  OT_CHECK(size >= 0, path, ": cannot determine the file size");
  in.seekg(0);
  return in;
}

}  // namespace

Tensor read_npy(const std::string& path) {
  int64_t size = 0;
  std::ifstream in = open_for_read(path, size);
  return read_npy_stream(in, size, path);
}

Tensor read_npy_stream(std::istream& in, int64_t size, const std::string& path) {
  std::array<unsigned char, kPreludeV2> prelude{};
  auto got = static_cast<int64_t>(
      in.read(reinterpret_cast<char*>(prelude.data()), std::min<int64_t>(size, kPreludeV2))
          .gcount());
  OT_CHECK(got >= static_cast<int64_t>(kMagic.size()) &&
               std::memcmp(prelude.data(), kMagic.data(), kMagic.size()) == 0,
           path, ": not a .npy file (no \\x93NUMPY magic at offset 0)");
  OT_CHECK(got >= 8, path, ": .npy file is truncated at offset ", got,
           " (no format version after the magic)");
  int major = prelude[6], minor = prelude[7];
  OT_CHECK(major >= 1 && major <= 3 && minor == 0, path, ": .npy format version ", major, ".",
           minor, " at offset 6 is not supported (1.0, 2.0 and 3.0 are)");
  size_t prelude_len = major == 1 ? kPreludeV1 : kPreludeV2;
  OT_CHECK(got >= static_cast<int64_t>(prelude_len), path, ": .npy file is truncated at offset ",
           got, " (header length field incomplete)");
  int64_t header_len = read_le(prelude.data() + 8, major == 1 ? 2 : 4);
  OT_CHECK(header_len <= kMaxHeaderBytes, path, ": .npy header length ", header_len,
           " at offset 8 exceeds the limit of ", kMaxHeaderBytes, " bytes");
  auto data_offset = static_cast<int64_t>(prelude_len) + header_len;
  OT_CHECK(data_offset <= size, path, ": .npy header length ", header_len,
           " at offset 8 runs past the end of the file (", size, " bytes)");

  std::string header(static_cast<size_t>(header_len), '\0');
  in.seekg(static_cast<std::streamoff>(prelude_len));
  in.read(header.data(), header_len);
  OT_CHECK(in.gcount() == header_len, path, ": short read of the .npy header at offset ",
           prelude_len);
  NpyHeader h = HeaderParser(header, prelude_len, path).parse();
  DataType dt = dtype_from_descr(h.descr, prelude_len, path);
  OT_CHECK(!h.fortran_order, path, ": .npy header at offset ", prelude_len,
           ": fortran_order=True is not supported; save a C-ordered array "
           "(np.ascontiguousarray)");

  int64_t count = graph::checked_element_count(h.shape, cat(path, ": .npy shape"));
  auto bytes = graph::dtype_storage_bytes(dt, count);
  OT_CHECK(bytes.has_value(), path, ": .npy shape ", shape_text(h.shape), " overflows int64 bytes");
  int64_t available = size - data_offset;
  OT_CHECK(available >= *bytes, path, ": .npy data at offset ", data_offset, " holds ", available,
           " bytes but shape ", shape_text(h.shape), " of '", h.descr, "' needs ", *bytes,
           " (file truncated?)");
  OT_CHECK(available == *bytes, path, ": ", available - *bytes,
           " unexpected trailing bytes at offset ", data_offset + *bytes, " after the .npy data");

  Tensor t(dt, h.shape);
  if (t.nbytes()) {
    in.seekg(data_offset);
    in.read(reinterpret_cast<char*>(t.mutable_data()), static_cast<std::streamsize>(t.nbytes()));
    OT_CHECK(in.gcount() == static_cast<std::streamsize>(t.nbytes()), path,
             ": short read of the .npy data at offset ", data_offset);
  }
  return t;
}

bool npy_supports(DataType t) {
  return npy_type_of(t).has_value();
}

void write_npy(const std::string& path, const Tensor& t) {
  auto type = npy_type_of(t.dtype());
  OT_CHECK(type.has_value(), path, ": cannot write dtype ", graph::dtype_short_name(t.dtype()),
           " to .npy (supported: f16 f32 f64 i8 i16 i32 i64 u8 u16 u32 u64 bool)");
  char order = type->size == 1 ? '|' : '<';
  std::string header = cat("{'descr': '", order, type->kind, type->size,
                           "', 'fortran_order': False, 'shape': ", shape_text(t.dims()), ", }");
  // numpy pads with spaces and a final newline so the data starts 64-byte aligned.
  size_t prelude_len = header.size() + 1 + kPreludeV1 < 65536 ? kPreludeV1 : kPreludeV2;
  size_t total = prelude_len + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string prelude(kMagic);
  prelude.push_back(static_cast<char>(prelude_len == kPreludeV1 ? 1 : 2));
  prelude.push_back('\0');
  auto len = static_cast<uint32_t>(header.size());
  for (size_t i = 0; i < prelude_len - 8; ++i) prelude.push_back(static_cast<char>(len >> (8 * i)));

  // graph/file_io's one writer: a failed write never leaves a half-written file behind.
  graph::OutputFile out(path);
  out.write(prelude);
  out.write(header);
  if (t.nbytes()) out.write(t.data(), t.nbytes());
  out.commit();
}

Tensor read_tensor_pb(const std::string& path) {
  int64_t size = 0;
  std::ifstream in = open_for_read(path, size);
  OT_CHECK(size <= kMaxPbBytes, path, ": ", size, " bytes exceeds protobuf's 2 GiB limit");
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), size);
  OT_CHECK(in.gcount() == size, path, ": short read");
  return graph::import_tensor_proto(bytes, path);
}

Tensor read_tensor_file(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  if (ext == ".npy") return read_npy(path);
  if (ext == ".pb") return read_tensor_pb(path);
  fail(path, ": unknown tensor file extension '", ext, "' (expected .npy or .pb)");
}

}  // namespace onnxtrain::runtime
