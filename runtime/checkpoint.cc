// Checkpoint file writer (temporary file + fsync + rename + folder fsync) and verifying reader;
// the layout is documented in checkpoint.h.
#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <span>

#include "graph/error.h"
#include "graph/file_io.h"

namespace onnxtrain::runtime {
namespace {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian; add byte swapping for this host");

constexpr char kMagic[8] = {'O', 'T', 'C', 'K', 'P', 'T', '\r', '\n'};
constexpr char kTrailerMagic[8] = {'O', 'T', 'C', 'K', 'E', 'N', 'D', '\n'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 32;
constexpr uint64_t kRecordHeaderBytes = 24;
constexpr uint64_t kTrailerBytes = 24;
constexpr uint32_t kKindTensor = 1;
constexpr uint32_t kKindMeta = 2;
// Limits that keep a corrupt length field from turning into a huge allocation or loop.
constexpr uint32_t kMaxNameBytes = 1 << 20;
constexpr uint32_t kMaxRank = 64;

// zlib treats a null buffer as "return the initial value", so empty spans must not reach it.
uint32_t crc_update(uint32_t crc, const void* p, size_t n) {
  if (n == 0) return crc;
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(p), n));
}

// Little-endian field packing for the fixed-size headers.
struct Packer {
  std::string bytes;
  template <typename T>
  void put(T v) {
    bytes.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
};

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string errno_text() {
  return std::strerror(errno);
}

// ---- writing ----

// The checkpoint's bytes through graph/file_io's one writer (temporary file, fsync, rename,
// folder fsync), with the running CRC of everything written.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path) : file_(path) {}
  void write(const void* p, size_t n) {
    crc_ = crc_update(crc_, p, n);
    file_.write(p, n);
  }
  void write(const std::string& s) { write(s.data(), s.size()); }
  uint32_t crc() const { return crc_; }
  void commit() { file_.commit(); }

 private:
  graph::OutputFile file_;
  uint32_t crc_ = 0;
};

void write_record(FileWriter& out, uint32_t kind, const std::string& name,
                  std::span<const std::span<const std::byte>> payload) {
  uint64_t payload_len = 0;
  for (auto part : payload) payload_len += part.size();
  Packer head;
  head.put<uint32_t>(kind);
  head.put<uint32_t>(static_cast<uint32_t>(name.size()));
  head.put<uint64_t>(payload_len);
  uint32_t crc = crc_update(0, head.bytes.data(), head.bytes.size());
  crc = crc_update(crc, name.data(), name.size());
  for (auto part : payload) crc = crc_update(crc, part.data(), part.size());
  head.put<uint32_t>(crc);
  head.put<uint32_t>(0);
  out.write(head.bytes);
  out.write(name);
  for (auto part : payload) out.write(part.data(), part.size());
}

std::span<const std::byte> as_bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

void write_tensor_record(FileWriter& out, const std::string& path, const NamedTensor& nt) {
  const graph::Tensor& t = nt.tensor;
  OT_CHECK(t.dtype() != graph::DataType::kUndefined, path, ": tensor '", nt.name, "' has no dtype");
  OT_CHECK(t.rank() <= kMaxRank, path, ": tensor '", nt.name, "' has rank ", t.rank(), " (at most ",
           kMaxRank, ")");
  Packer prefix;
  prefix.put<int32_t>(static_cast<int32_t>(t.dtype()));
  prefix.put<uint32_t>(static_cast<uint32_t>(t.rank()));
  for (int64_t d : t.dims()) prefix.put<int64_t>(d);
  if (t.dtype() == graph::DataType::kString) {
    OT_CHECK(static_cast<int64_t>(t.strings().size()) == t.numel(), path, ": tensor '", nt.name,
             "' holds ", t.strings().size(), " strings for ", t.numel(), " elements");
    Packer data;
    for (const std::string& s : t.strings()) {
      data.put<uint64_t>(s.size());
      data.bytes += s;
    }
    std::span<const std::byte> parts[] = {as_bytes(prefix.bytes), as_bytes(data.bytes)};
    write_record(out, kKindTensor, nt.name, parts);
  } else {
    std::span<const std::byte> parts[] = {as_bytes(prefix.bytes), {t.data(), t.nbytes()}};
    write_record(out, kKindTensor, nt.name, parts);
  }
}

// ---- reading ----

// Sequential reader over a file of known size; every read is checked against the size first
// and feeds the whole-file and current-record checksums.
class FileReader {
 public:
  explicit FileReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    OT_CHECK(fd_ >= 0, path, ": cannot open checkpoint: ", errno_text());
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail(path, ": not a regular file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileReader() { ::close(fd_); }

  uint64_t size() const { return size_; }
  uint64_t offset() const { return offset_; }
  uint32_t file_crc() const { return file_crc_; }
  uint32_t record_crc() const { return record_crc_; }
  void start_record() { record_crc_ = 0; }

  // `what` names the field for the truncation message.
  void read(void* dst, uint64_t n, const std::string& what) {
    OT_CHECK(n <= size_ - offset_, path_, ": ", what, " at byte ", offset_, ": needs ", n,
             " bytes, only ", size_ - offset_, " left (truncated file)");
    char* c = static_cast<char*>(dst);
    uint64_t left = n;
    while (left > 0) {
      ssize_t r = ::read(fd_, c, left);
      if (r < 0 && errno == EINTR) continue;
      OT_CHECK(r > 0, path_, ": ", what, " at byte ", offset_ + (n - left),
               ": read failed: ", r == 0 ? std::string("unexpected end of file") : errno_text());
      c += r;
      left -= static_cast<uint64_t>(r);
    }
    file_crc_ = crc_update(file_crc_, dst, n);
    record_crc_ = crc_update(record_crc_, dst, n);
    offset_ += n;
  }
  template <typename T>
  T read_value(const std::string& what) {
    T v;
    read(&v, sizeof(T), what);
    return v;
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t offset_ = 0;
  uint32_t file_crc_ = 0;
  uint32_t record_crc_ = 0;
};

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Reads a tensor payload of exactly `payload_len` bytes (already known to lie inside the file).
graph::Tensor read_tensor_payload(FileReader& in, const std::string& path, const std::string& where,
                                  uint64_t payload_len) {
  OT_CHECK(payload_len >= 8, path, ": ", where, ": tensor payload of ", payload_len,
           " bytes is shorter than its 8-byte dtype/rank prefix");
  const uint64_t start = in.offset();
  int32_t dtype_value = in.read_value<int32_t>(where + " dtype");
  uint32_t rank = in.read_value<uint32_t>(where + " rank");
  OT_CHECK(graph::is_known_dtype(dtype_value), path, ": ", where, " at byte ", start,
           ": unknown dtype ", dtype_value);
  OT_CHECK(rank <= kMaxRank && 8 + 8 * uint64_t{rank} <= payload_len, path, ": ", where,
           " at byte ", start + 4, ": rank ", rank, " does not fit a payload of ", payload_len,
           " bytes");
  std::vector<int64_t> dims(rank);
  if (rank) in.read(dims.data(), 8 * uint64_t{rank}, where + " dims");
  const auto dtype = static_cast<graph::DataType>(dtype_value);
  int64_t numel = 0;
  try {
    numel = graph::checked_element_count(dims, "dims");
  } catch (const Error& e) {
    fail(path, ": ", where, " at byte ", start + 8, ": ", e.what());
  }
  const uint64_t data_len = payload_len - 8 - 8 * uint64_t{rank};
  const uint64_t data_at = in.offset();
  if (dtype != graph::DataType::kString) {
    auto bytes = graph::dtype_storage_bytes(dtype, numel);
    OT_CHECK(bytes && static_cast<uint64_t>(*bytes) == data_len, path, ": ", where, " at byte ",
             data_at, ": ", graph::dtype_short_name(dtype), " data of ", numel, " elements needs ",
             bytes ? *bytes : -1, " bytes, the record holds ", data_len);
    graph::Tensor t(dtype, std::move(dims));
    if (data_len) in.read(t.mutable_data(), data_len, where + " data");
    return t;
  }
  // Each string needs at least its 8-byte length, which bounds numel before allocating.
  OT_CHECK(static_cast<uint64_t>(numel) <= data_len / 8, path, ": ", where, " at byte ", data_at,
           ": ", numel, " strings cannot fit in ", data_len, " bytes");
  graph::Tensor t(dtype, std::move(dims));
  uint64_t left = data_len;
  for (std::string& s : t.mutable_strings()) {
    uint64_t at = in.offset();
    OT_CHECK(left >= 8, path, ": ", where, " at byte ", at,
             ": string length runs past the record (", left, " bytes left)");
    uint64_t len = in.read_value<uint64_t>(where + " string length");
    left -= 8;
    OT_CHECK(len <= left, path, ": ", where, " at byte ", at, ": string of ", len,
             " bytes runs past the record (", left, " left)");
    s.resize(len);
    if (len) in.read(s.data(), len, where + " string");
    left -= len;
  }
  OT_CHECK(left == 0, path, ": ", where, " at byte ", in.offset(), ": ", left,
           " bytes left over after the strings");
  return t;
}

bool parse_checkpoint_name(const std::string& name, int64_t& step) {
  const std::string prefix = "ckpt-", suffix = ".otck";
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) ||
      !name.ends_with(suffix))
    return false;
  std::string_view digits(name.data() + prefix.size(), name.size() - prefix.size() - suffix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  return ec == std::errc() && p == digits.data() + digits.size();
}

}  // namespace

// ---- Checkpoint ----

void Checkpoint::add_tensor(const std::string& name, graph::Tensor tensor) {
  OT_CHECK(find_tensor(name) == nullptr, "checkpoint: duplicate tensor '", name, "'");
  tensors.push_back({name, std::move(tensor)});
}

const graph::Tensor* Checkpoint::find_tensor(const std::string& name) const {
  for (const NamedTensor& nt : tensors)
    if (nt.name == name) return &nt.tensor;
  return nullptr;
}

const std::string& Checkpoint::meta(const std::string& key) const {
  auto it = metadata.find(key);
  OT_CHECK(it != metadata.end(), "checkpoint: metadata key '", key, "' is missing");
  return it->second;
}

void write_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  std::set<std::string> names;
  for (const NamedTensor& nt : ckpt.tensors) {
    OT_CHECK(names.insert(nt.name).second, path, ": duplicate tensor '", nt.name, "'");
    OT_CHECK(nt.name.size() <= kMaxNameBytes, path, ": tensor name of ", nt.name.size(),
             " bytes is too long");
  }
  for (const auto& [key, value] : ckpt.metadata)
    OT_CHECK(key.size() <= kMaxNameBytes, path, ": metadata key of ", key.size(),
             " bytes is too long");
  const uint64_t record_count = ckpt.metadata.size() + ckpt.tensors.size();

  FileWriter out(path);
  Packer header;
  header.bytes.assign(kMagic, sizeof kMagic);
  header.put<uint32_t>(kVersion);
  header.put<uint32_t>(0);
  header.put<uint64_t>(record_count);
  header.put<uint32_t>(crc_update(0, header.bytes.data(), header.bytes.size()));
  header.put<uint32_t>(0);
  out.write(header.bytes);
  for (const auto& [key, value] : ckpt.metadata) {
    std::span<const std::byte> parts[] = {as_bytes(value)};
    write_record(out, kKindMeta, key, parts);
  }
  for (const NamedTensor& nt : ckpt.tensors) write_tensor_record(out, path, nt);
  Packer trailer;
  trailer.bytes.assign(kTrailerMagic, sizeof kTrailerMagic);
  trailer.put<uint64_t>(record_count);
  trailer.put<uint32_t>(out.crc());
  trailer.put<uint32_t>(0);
  out.write(trailer.bytes);
  out.commit();
}

namespace {
Checkpoint read_checkpoint_file(const std::string& path, bool metadata_only);
}  // namespace

Checkpoint read_checkpoint(const std::string& path) {
  return read_checkpoint_file(path, false);
}

Checkpoint read_checkpoint_metadata(const std::string& path) {
  return read_checkpoint_file(path, true);
}

namespace {

Checkpoint read_checkpoint_file(const std::string& path, bool metadata_only) {
  FileReader in(path);
  const uint64_t size = in.size();
  char magic[8] = {};
  OT_CHECK(size >= sizeof magic, path, ": not an onnxtrain checkpoint (", size,
           " bytes, too short for the magic)");
  in.read(magic, sizeof magic, "magic");
  OT_CHECK(std::memcmp(magic, kMagic, sizeof magic) == 0, path,
           ": not an onnxtrain checkpoint (bad magic at byte 0)");
  OT_CHECK(size >= kHeaderBytes + kTrailerBytes, path, ": file of ", size,
           " bytes is shorter than header + trailer (", kHeaderBytes + kTrailerBytes,
           "); truncated");
  uint32_t version = in.read_value<uint32_t>("header version");
  OT_CHECK(version == kVersion, path, ": header at byte 8: unsupported version ", version,
           " (this build reads ", kVersion, ")");
  uint32_t flags = in.read_value<uint32_t>("header flags");
  uint64_t record_count = in.read_value<uint64_t>("header record count");
  uint32_t computed = in.record_crc();
  uint32_t stored = in.read_value<uint32_t>("header checksum");
  OT_CHECK(stored == computed, path, ": header at byte 0: checksum mismatch (stored ", hex(stored),
           ", computed ", hex(computed), ")");
  uint32_t zero = in.read_value<uint32_t>("header padding");
  OT_CHECK(flags == 0 && zero == 0, path, ": header at byte 12: unknown flags ", flags, "/", zero);
  const uint64_t records_end = size - kTrailerBytes;
  OT_CHECK(record_count <= (records_end - kHeaderBytes) / kRecordHeaderBytes, path,
           ": header at byte 16: ", record_count, " records cannot fit in a file of ", size,
           " bytes");

  Checkpoint ckpt;
  std::set<std::string> tensor_names;
  for (uint64_t i = 0; i < record_count; ++i) {
    const uint64_t at = in.offset();
    std::string where = cat("record ", i, " at byte ", at);
    OT_CHECK(records_end - at >= kRecordHeaderBytes, path, ": ", where,
             ": record header runs into the trailer (truncated file)");
    in.start_record();
    uint32_t kind = in.read_value<uint32_t>(where + " kind");
    uint32_t name_len = in.read_value<uint32_t>(where + " name length");
    uint64_t payload_len = in.read_value<uint64_t>(where + " payload length");
    uint32_t header_crc = in.record_crc();
    uint32_t stored_crc = in.read_value<uint32_t>(where + " checksum");
    uint32_t pad = in.read_value<uint32_t>(where + " padding");
    OT_CHECK(kind == kKindTensor || kind == kKindMeta, path, ": ", where, ": unknown kind ", kind);
    if (metadata_only && kind == kKindTensor) return ckpt;  // the metadata records come first
    OT_CHECK(pad == 0, path, ": ", where, ": nonzero padding ", pad);
    const uint64_t room = records_end - in.offset();
    OT_CHECK(name_len <= kMaxNameBytes && name_len <= room && payload_len <= room - name_len, path,
             ": ", where, ": name of ", name_len, " + payload of ", payload_len,
             " bytes run past the end of the records (", room, " bytes left; truncated file)");
    std::string name(name_len, '\0');
    // The record checksum covers its 16 leading header bytes, then name and payload.
    uint32_t crc = header_crc;
    uint64_t body_at = in.offset();
    in.start_record();
    if (name_len) in.read(name.data(), name_len, where + " name");
    where = cat("record ", i, " '", name, "' at byte ", at);
    if (kind == kKindMeta) {
      std::string value(payload_len, '\0');
      if (payload_len) in.read(value.data(), payload_len, where + " value");
      OT_CHECK(ckpt.metadata.emplace(name, std::move(value)).second, path, ": ", where,
               ": duplicate metadata key");
    } else {
      graph::Tensor t = read_tensor_payload(in, path, where, payload_len);
      OT_CHECK(tensor_names.insert(name).second, path, ": ", where, ": duplicate tensor name");
      ckpt.tensors.push_back({name, std::move(t)});
    }
    OT_CHECK(in.offset() == body_at + name_len + payload_len, path, ": ", where,
             ": payload length ", payload_len, " disagrees with its contents");
    crc = static_cast<uint32_t>(
        crc32_combine(crc, in.record_crc(), static_cast<z_off_t>(name_len + payload_len)));
    OT_CHECK(crc == stored_crc, path, ": ", where, ": checksum mismatch (stored ", hex(stored_crc),
             ", computed ", hex(crc), ")");
  }
  OT_CHECK(in.offset() == records_end, path, ": ", records_end - in.offset(),
           " unexpected bytes at byte ", in.offset(), " after the last record");
  const uint32_t file_crc = in.file_crc();
  char trailer_magic[8] = {};
  in.read(trailer_magic, sizeof trailer_magic, "trailer magic");
  OT_CHECK(std::memcmp(trailer_magic, kTrailerMagic, sizeof trailer_magic) == 0, path,
           ": trailer at byte ", records_end, ": bad magic (truncated or corrupt file)");
  uint64_t trailer_count = in.read_value<uint64_t>("trailer record count");
  OT_CHECK(trailer_count == record_count, path, ": trailer at byte ", records_end + 8,
           ": record count ", trailer_count, " differs from the header's ", record_count);
  uint32_t stored_file_crc = in.read_value<uint32_t>("trailer checksum");
  OT_CHECK(stored_file_crc == file_crc, path, ": trailer at byte ", records_end + 16,
           ": whole-file checksum mismatch (stored ", hex(stored_file_crc), ", computed ",
           hex(file_crc), ")");
  uint32_t trailer_pad = in.read_value<uint32_t>("trailer padding");
  OT_CHECK(trailer_pad == 0, path, ": trailer at byte ", records_end + 20, ": nonzero padding");
  return ckpt;
}

}  // namespace

// ---- directories ----

std::string checkpoint_file_name(int64_t step) {
  OT_CHECK(step >= 0, "checkpoint step is negative (", step, ")");
  return cat("ckpt-", step, ".otck");
}

std::vector<CheckpointFile> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointFile> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  fs::directory_iterator it(dir, ec);
  OT_CHECK(!ec, dir, ": cannot list checkpoints: ", ec.message());
  for (const fs::directory_entry& e : it) {
    int64_t step = 0;
    if (!e.is_regular_file(ec) || !parse_checkpoint_name(e.path().filename().string(), step))
      continue;
    out.push_back({step, e.path().string()});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
}

std::optional<LoadedCheckpoint> load_latest_checkpoint(const std::string& dir,
                                                       std::vector<std::string>* skipped) {
  std::vector<CheckpointFile> files = list_checkpoints(dir);
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    try {
      return LoadedCheckpoint{*it, read_checkpoint(it->path)};
    } catch (const Error& e) {
      if (skipped) skipped->push_back(e.what());
    }
  }
  return std::nullopt;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, const std::string& run_id,
                                           int keep_last) {
  OT_CHECK(keep_last >= 0, dir, ": keep_last is negative (", keep_last, ")");
  OT_CHECK(!run_id.empty(), dir, ": pruning needs the run's id");
  std::vector<CheckpointFile> own;
  for (const CheckpointFile& f : list_checkpoints(dir)) {
    try {
      const Checkpoint meta = read_checkpoint_metadata(f.path);
      auto it = meta.metadata.find(kRunIdKey);
      if (it != meta.metadata.end() && it->second == run_id) own.push_back(f);
    } catch (const Error&) {
      // unreadable: not provably this run's, so never deleted
    }
  }
  std::vector<std::string> removed;
  const size_t keep = static_cast<size_t>(keep_last);
  for (size_t i = 0; i + keep < own.size(); ++i) {
    std::error_code ec;
    fs::remove(own[i].path, ec);
    OT_CHECK(!ec, own[i].path, ": cannot delete old checkpoint: ", ec.message());
    removed.push_back(own[i].path);
  }
  return removed;
}

}  // namespace onnxtrain::runtime
