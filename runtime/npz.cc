// NumPy .npz archives: a zip file whose members are .npy files (np.savez stores them,
// np.savez_compressed deflates them; numpy writes every member with zip64 extra fields). Only
// what numpy writes is read: one disk, methods 0 (stored) and 8 (deflate), no encryption. The
// central directory is the truth for sizes and offsets; each is checked against the file size
// before anything is allocated, and each member's CRC-32 against its bytes.
#include <zlib.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "graph/error.h"
#include "runtime/npy.h"

namespace onnxtrain::runtime {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kZip64EocdSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr int64_t kEocdBytes = 22;
constexpr int64_t kMaxComment = 0xFFFF;
constexpr int64_t kMaxMembers = 100000;
constexpr int64_t kMaxMemberBytes = int64_t{16} << 30;
constexpr int64_t kMaxDeflateRatio = 1100;  // deflate cannot expand more than ~1032:1

uint64_t le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

class ZipFile {
 public:
  explicit ZipFile(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    std::error_code ec;
    OT_CHECK(fs::exists(path, ec), path, ": file not found");
    OT_CHECK(fs::is_regular_file(path, ec), path, ": not a regular file");
    OT_CHECK(in_.good(), path, ": cannot open: ", std::strerror(errno));
    in_.seekg(0, std::ios::end);
    size_ = static_cast<int64_t>(in_.tellg());
  }

  // Bytes [offset, offset + n) of the file; fails naming `what` when they are not all there.
  std::string read(int64_t offset, int64_t n, const std::string& what) {
    OT_CHECK(offset >= 0 && n >= 0 && offset <= size_ && n <= size_ - offset, path_, ": ", what,
             " at byte offset ", offset, " (", n, " bytes) runs past the end of the file (",
             size_, " bytes): not a complete .npz (zip) file");
    std::string out(static_cast<size_t>(n), '\0');
    in_.clear();
    in_.seekg(offset);
    in_.read(out.data(), n);
    OT_CHECK(in_.gcount() == n, path_, ": short read of ", what, " at byte offset ", offset);
    return out;
  }

  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream in_;
  int64_t size_ = 0;
};

struct Member {
  std::string name;
  int method = 0;
  uint32_t crc = 0;
  int64_t compressed = 0, uncompressed = 0, local_offset = 0;
};

const unsigned char* bytes_of(const std::string& s, size_t at = 0) {
  return reinterpret_cast<const unsigned char*>(s.data()) + at;
}

// The central directory's offset, size and member count (the zip64 record when present).
struct Directory {
  int64_t offset = 0, size = 0, count = 0;
};

Directory find_directory(ZipFile& z) {
  OT_CHECK(z.size() >= kEocdBytes, z.path(), ": ", z.size(),
           " bytes is too small for a .npz (zip) file");
  const int64_t tail_len = std::min(z.size(), kEocdBytes + kMaxComment);
  const std::string tail = z.read(z.size() - tail_len, tail_len, "the end of the archive");
  int64_t at = -1;
  for (int64_t i = tail_len - kEocdBytes; i >= 0; --i)
    if (le(bytes_of(tail, static_cast<size_t>(i)), 4) == kEocdSig) {
      at = i;
      break;
    }
  OT_CHECK(at >= 0, z.path(), ": not a .npz file (no zip end-of-central-directory record; ",
           "write it with np.savez or np.savez_compressed)");
  const unsigned char* e = bytes_of(tail, static_cast<size_t>(at));
  const int64_t eocd_offset = z.size() - tail_len + at;
  OT_CHECK(le(e + 4, 2) == 0 && le(e + 6, 2) == 0, z.path(),
           ": multi-disk zip archives are not supported");
  Directory d{static_cast<int64_t>(le(e + 16, 4)), static_cast<int64_t>(le(e + 12, 4)),
              static_cast<int64_t>(le(e + 10, 2))};
  const bool zip64 = le(e + 10, 2) == 0xFFFF || le(e + 12, 4) == 0xFFFFFFFF ||
                     le(e + 16, 4) == 0xFFFFFFFF;
  // A zip64 locator sits right before the classic record when the archive has one.
  const std::string loc =
      eocd_offset >= 20 ? z.read(eocd_offset - 20, 20, "the zip64 locator") : std::string();
  if (!loc.empty() && le(bytes_of(loc), 4) == kZip64LocatorSig) {
    const auto rec_offset = static_cast<int64_t>(le(bytes_of(loc, 8), 8));
    const std::string rec = z.read(rec_offset, 56, "the zip64 end-of-central-directory record");
    OT_CHECK(le(bytes_of(rec), 4) == kZip64EocdSig, z.path(),
             ": bad zip64 end-of-central-directory signature at byte offset ", rec_offset);
    d.count = static_cast<int64_t>(le(bytes_of(rec, 32), 8));
    d.size = static_cast<int64_t>(le(bytes_of(rec, 40), 8));
    d.offset = static_cast<int64_t>(le(bytes_of(rec, 48), 8));
  } else {
    OT_CHECK(!zip64, z.path(), ": zip64 sizes without a zip64 locator");
  }
  OT_CHECK(d.count >= 0 && d.count <= kMaxMembers, z.path(), ": ", d.count,
           " archive members exceed the limit of ", kMaxMembers);
  return d;
}

std::vector<Member> read_members(ZipFile& z) {
  const Directory d = find_directory(z);
  const std::string dir = z.read(d.offset, d.size, "the zip central directory");
  std::vector<Member> out;
  size_t at = 0;
  for (int64_t k = 0; k < d.count; ++k) {
    const int64_t here = d.offset + static_cast<int64_t>(at);
    OT_CHECK(at + 46 <= dir.size() && le(bytes_of(dir, at), 4) == kCentralSig, z.path(),
             ": bad zip central directory entry ", k, " at byte offset ", here);
    const unsigned char* c = bytes_of(dir, at);
    Member m;
    const auto flags = static_cast<int>(le(c + 8, 2));
    m.method = static_cast<int>(le(c + 10, 2));
    m.crc = static_cast<uint32_t>(le(c + 16, 4));
    m.compressed = static_cast<int64_t>(le(c + 20, 4));
    m.uncompressed = static_cast<int64_t>(le(c + 24, 4));
    const size_t name_len = le(c + 28, 2), extra_len = le(c + 30, 2), comment_len = le(c + 32, 2);
    m.local_offset = static_cast<int64_t>(le(c + 42, 4));
    OT_CHECK(at + 46 + name_len + extra_len + comment_len <= dir.size(), z.path(),
             ": zip central directory entry ", k, " at byte offset ", here,
             " runs past the directory");
    m.name.assign(dir, at + 46, name_len);
    OT_CHECK((flags & 1) == 0, z.path(), ": member '", m.name, "' is encrypted");
    // zip64 extra field (id 1): the 8-byte values of the fields saturated above, in order.
    for (size_t e = at + 46 + name_len; e + 4 <= at + 46 + name_len + extra_len;) {
      const auto id = le(bytes_of(dir, e), 2);
      const size_t len = le(bytes_of(dir, e + 2), 2);
      OT_CHECK(e + 4 + len <= at + 46 + name_len + extra_len, z.path(), ": member '", m.name,
               "': extra field runs past its entry");
      if (id == 1) {
        size_t f = e + 4;
        for (int64_t* v : {&m.uncompressed, &m.compressed, &m.local_offset}) {
          if (*v != 0xFFFFFFFF) continue;
          OT_CHECK(f + 8 <= e + 4 + len, z.path(), ": member '", m.name,
                   "': zip64 extra field too short");
          *v = static_cast<int64_t>(le(bytes_of(dir, f), 8));
          f += 8;
        }
      }
      e += 4 + len;
    }
    OT_CHECK(m.method == 0 || m.method == 8, z.path(), ": member '", m.name,
             "' uses zip compression method ", m.method,
             " (np.savez stores, np.savez_compressed deflates; other methods are not supported)");
    OT_CHECK(m.uncompressed >= 0 && m.uncompressed <= kMaxMemberBytes, z.path(), ": member '",
             m.name, "' claims ", m.uncompressed, " bytes (limit ", kMaxMemberBytes, ")");
    OT_CHECK(m.method != 0 || m.compressed == m.uncompressed, z.path(), ": stored member '",
             m.name, "' has different compressed and uncompressed sizes");
    OT_CHECK(m.method != 8 || m.uncompressed <= m.compressed * kMaxDeflateRatio + 64, z.path(),
             ": member '", m.name, "' claims ", m.uncompressed, " bytes from ", m.compressed,
             " compressed (more than deflate can expand)");
    out.push_back(std::move(m));
    at += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

std::string inflate_member(const std::string& packed, const Member& m, const std::string& where) {
  std::string out(static_cast<size_t>(m.uncompressed), '\0');
  z_stream s{};
  OT_CHECK(inflateInit2(&s, -MAX_WBITS) == Z_OK, where, ": zlib inflateInit failed");
  int64_t in_done = 0, out_done = 0;
  int r = Z_OK;
  while (r == Z_OK) {
    const auto in_chunk = static_cast<uInt>(
        std::min<int64_t>(static_cast<int64_t>(packed.size()) - in_done, INT_MAX / 2));
    const auto out_chunk = static_cast<uInt>(std::min<int64_t>(m.uncompressed - out_done, INT_MAX / 2));
    s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data())) + in_done;
    s.avail_in = in_chunk;
    s.next_out = reinterpret_cast<Bytef*>(out.data()) + out_done;
    s.avail_out = out_chunk;
    r = inflate(&s, Z_NO_FLUSH);
    in_done += in_chunk - s.avail_in;
    out_done += out_chunk - s.avail_out;
    if (r == Z_BUF_ERROR && (s.avail_in == 0 || out_done == m.uncompressed)) break;
  }
  const std::string msg = s.msg ? s.msg : "";
  inflateEnd(&s);
  OT_CHECK(r == Z_STREAM_END, where, ": corrupt deflate data",
           msg.empty() ? std::string() : cat(" (", msg, ")"), " after ", out_done,
           " of ", m.uncompressed, " bytes");
  OT_CHECK(out_done == m.uncompressed, where, ": inflated to ", out_done, " bytes, the directory says ",
           m.uncompressed);
  return out;
}

}  // namespace

namespace {

// The members' arrays, or only the one named `only` when given.
std::vector<std::pair<std::string, graph::Tensor>> read_arrays(const std::string& path,
                                                               const std::string* only) {
  ZipFile z(path);
  std::vector<std::pair<std::string, graph::Tensor>> out;
  std::set<std::string> seen;
  for (const Member& m : read_members(z)) {
    if (only && m.name != *only && m.name != *only + ".npy") continue;
    const std::string where = cat(path, ":", m.name);
    const std::string local = z.read(m.local_offset, 30, cat("the local header of '", m.name, "'"));
    OT_CHECK(le(bytes_of(local), 4) == kLocalSig, path, ": member '", m.name,
             "': bad local header signature at byte offset ", m.local_offset);
    const int64_t data_offset = m.local_offset + 30 + static_cast<int64_t>(le(bytes_of(local, 26), 2)) +
                                static_cast<int64_t>(le(bytes_of(local, 28), 2));
    std::string bytes = z.read(data_offset, m.compressed, cat("the data of '", m.name, "'"));
    if (m.method == 8) bytes = inflate_member(bytes, m, where);
    // crc32_z takes a size_t length; an empty member's CRC is 0 (zlib's initial value).
    const uLong got = bytes.empty()
                          ? 0
                          : crc32_z(0L, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
    OT_CHECK(got == m.crc, where, ": CRC-32 mismatch (the archive is damaged)");
    std::string name = m.name;
    if (name.ends_with(".npy")) name.resize(name.size() - 4);
    OT_CHECK(!name.empty(), path, ": member '", m.name, "' has an empty array name");
    OT_CHECK(seen.insert(name).second, path, ": two members are named '", name, "'");
    const auto size = static_cast<int64_t>(bytes.size());
    std::istringstream in(std::move(bytes));
    out.emplace_back(name, read_npy_stream(in, size, where));
  }
  OT_CHECK(only || !out.empty(), path, ": the .npz archive holds no arrays");
  return out;
}

}  // namespace

std::vector<std::pair<std::string, graph::Tensor>> read_npz(const std::string& path) {
  return read_arrays(path, nullptr);
}

std::optional<graph::Tensor> read_npz_array(const std::string& path, const std::string& name) {
  auto arrays = read_arrays(path, &name);
  if (arrays.empty()) return std::nullopt;
  return std::move(arrays.front().second);
}

}  // namespace onnxtrain::runtime
