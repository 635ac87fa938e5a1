// Checkpoint files: round trips of every dtype, crash safety of the atomic write, every
// truncation / byte flip refused with a one-line Error, hostile lengths refused before
// allocation, and the ckpt-<step>.otck directory helpers.
#include "runtime/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "graph/error.h"

namespace onnxtrain::runtime {
namespace {

namespace fs = std::filesystem;
using graph::DataType;
using graph::Tensor;

class CheckpointTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() / ("onnxtrain_ckpt_test_" + std::to_string(::getpid()) + "_" +
                                     testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

Tensor random_tensor(DataType dtype, std::vector<int64_t> dims, uint32_t seed) {
  Tensor t(dtype, std::move(dims));
  std::mt19937 rng(seed);
  if (dtype == DataType::kString) {
    for (auto& s : t.mutable_strings()) {
      s.assign(rng() % 7, '\0');
      for (auto& c : s) c = static_cast<char>(rng());
    }
  } else {
    for (size_t i = 0; i < t.nbytes(); ++i) t.mutable_data()[i] = static_cast<std::byte>(rng());
  }
  return t;
}

Checkpoint sample_checkpoint() {
  Checkpoint c;
  c.metadata["step"] = "120";
  c.metadata["epoch"] = "2";
  c.metadata["rng"] = std::string("\x01\x00\xff seed", 8);
  c.metadata["empty"] = "";
  c.add_tensor("fc.weight", random_tensor(DataType::kFloat, {3, 4}, 1));
  c.add_tensor("step_count", random_tensor(DataType::kInt64, {}, 2));
  c.add_tensor("labels", random_tensor(DataType::kString, {3}, 3));
  c.add_tensor("empty", random_tensor(DataType::kDouble, {0, 5}, 4));
  return c;
}

void expect_same(const Checkpoint& a, const Checkpoint& b) {
  EXPECT_EQ(a.metadata, b.metadata);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_TRUE(a.tensors[i].tensor.equals(b.tensors[i].tensor)) << a.tensors[i].name;
  }
}

// Error message of read_checkpoint(p), or "" when it reads. Every message must be one line
// naming the file.
std::string read_error(const std::string& p) {
  try {
    read_checkpoint(p);
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_EQ(m.rfind(p, 0), 0u) << m;
    return m.empty() ? "(empty)" : m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << p << ": not an onnxtrain::Error: " << e.what();
    return "(wrong exception)";
  }
  return "";
}

TEST_F(CheckpointTest, RoundTripsEveryDtypeShapeAndMetadata) {
  Checkpoint c;
  int seed = 0;
  for (int v = 1; v <= 22; ++v) {
    auto dtype = static_cast<DataType>(v);
    std::string name = std::string(graph::dtype_short_name(dtype));
    c.add_tensor(name + "/scalar", random_tensor(dtype, {}, ++seed));
    c.add_tensor(name + "/2x3", random_tensor(dtype, {2, 3}, ++seed));
    c.add_tensor(name + "/odd", random_tensor(dtype, {1, 7, 1}, ++seed));
    c.add_tensor(name + "/empty", random_tensor(dtype, {4, 0}, ++seed));
  }
  c.metadata["options_hash"] = "0123456789abcdef";
  c.metadata["data_position"] = std::string(1000, 'x');
  write_checkpoint(path("all.otck"), c);
  expect_same(c, read_checkpoint(path("all.otck")));
  EXPECT_EQ(read_checkpoint(path("all.otck")).meta("options_hash"), "0123456789abcdef");
  // Order is kept, not sorted.
  EXPECT_EQ(read_checkpoint(path("all.otck")).tensors[0].name, "f32/scalar");
}

TEST_F(CheckpointTest, AccessorsAndWriterRefuseBadInput) {
  Checkpoint c = sample_checkpoint();
  EXPECT_NE(c.find_tensor("fc.weight"), nullptr);
  EXPECT_EQ(c.find_tensor("nope"), nullptr);
  EXPECT_THROW(c.meta("nope"), Error);
  EXPECT_THROW(c.add_tensor("fc.weight", Tensor(DataType::kFloat, {1})), Error);
  c.tensors.push_back({"fc.weight", Tensor(DataType::kFloat, {1})});
  EXPECT_THROW(write_checkpoint(path("dup.otck"), c), Error);
  EXPECT_THROW(write_checkpoint(path("no/such/dir/x.otck"), sample_checkpoint()), Error);
  EXPECT_FALSE(fs::exists(path("dup.otck")));
}

TEST_F(CheckpointTest, CrashMidWriteLeavesThePreviousCheckpoint) {
  const Checkpoint old = sample_checkpoint();
  write_checkpoint(path(checkpoint_file_name(10)), old);
  const std::string good = read_bytes(path(checkpoint_file_name(10)));

  // A writer killed mid-write leaves its temporary file; a non-atomic writer would have left
  // a half-written final file.
  write_bytes(path("ckpt-20.otck.tmp.4242"), good.substr(0, good.size() / 2));
  write_bytes(path(checkpoint_file_name(30)), good.substr(0, good.size() / 2));
  std::vector<std::string> skipped;
  auto latest = load_latest_checkpoint(dir_.string(), &skipped);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->file.step, 10);
  expect_same(old, latest->ckpt);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("ckpt-30.otck"), std::string::npos) << skipped[0];

  // A write that fails after it started (an undefined tensor comes last) leaves the
  // existing file untouched and no temporary file behind.
  Checkpoint bad = sample_checkpoint();
  bad.tensors.push_back({"broken", Tensor()});
  EXPECT_THROW(write_checkpoint(path(checkpoint_file_name(10)), bad), Error);
  EXPECT_EQ(read_bytes(path(checkpoint_file_name(10))), good);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(cat("tmp.", ::getpid())), std::string::npos)
        << e.path();

  // Overwriting replaces the file as a whole.
  Checkpoint next = sample_checkpoint();
  next.metadata["step"] = "121";
  write_checkpoint(path(checkpoint_file_name(10)), next);
  EXPECT_EQ(read_checkpoint(path(checkpoint_file_name(10))).meta("step"), "121");
}

TEST_F(CheckpointTest, EveryTruncationAndByteFlipIsAnError) {
  const std::string p = path("c.otck");
  write_checkpoint(p, sample_checkpoint());
  const std::string good = read_bytes(p);
  ASSERT_GT(good.size(), 200u);
  const std::string bad = path("bad.otck");
  for (size_t len = 0; len < good.size(); ++len) {
    write_bytes(bad, good.substr(0, len));
    std::string m = read_error(bad);
    ASSERT_TRUE(m != "" && m != "(wrong exception)") << "truncated at " << len;
  }
  for (size_t at = 0; at < good.size(); ++at) {
    for (unsigned char mask : {0x01, 0x80, 0xff}) {
      std::string b = good;
      b[at] = static_cast<char>(b[at] ^ mask);
      write_bytes(bad, b);
      std::string m = read_error(bad);
      ASSERT_TRUE(m != "" && m != "(wrong exception)") << "flip " << int{mask} << " at " << at;
    }
  }
  write_bytes(bad, good + "x");
  EXPECT_NE(read_error(bad), "");
  write_bytes(bad, "ir_version: 8\nproducer_name: \"onnx\"\n");
  EXPECT_NE(read_error(bad).find("not an onnxtrain checkpoint"), std::string::npos);
  // Specific messages name the record and the byte offset.
  std::string b = good;
  b[60] = static_cast<char>(b[60] ^ 1);  // inside record 0 (metadata "empty")
  write_bytes(bad, b);
  EXPECT_NE(read_error(bad).find("record 0"), std::string::npos) << read_error(bad);
  EXPECT_NE(read_error(bad).find("at byte 32"), std::string::npos) << read_error(bad);
}

// Recomputes every record checksum and the whole-file checksum after a deliberate edit, so
// the reader's size checks (not its checksums) must catch a hostile length.
std::string reseal(std::string b) {
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, b.data() + at, 4);
    return v;
  };
  auto u64 = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, b.data() + at, 8);
    return v;
  };
  auto crc = [&](size_t at, size_t n) {
    return static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(b.data() + at), static_cast<uInt>(n)));
  };
  uint64_t count = u64(16);
  size_t at = 32;
  for (uint64_t i = 0; i < count && at + 24 <= b.size() - 24; ++i) {
    uint64_t len = u32(at + 4) + u64(at + 8);
    uint64_t body = std::min<uint64_t>(len, b.size() - 24 - (at + 24));
    uint32_t c = crc(at, 16);
    c = static_cast<uint32_t>(
        crc32(c, reinterpret_cast<const Bytef*>(b.data() + at + 24), static_cast<uInt>(body)));
    std::memcpy(b.data() + at + 16, &c, 4);
    at += 24 + len;
  }
  uint32_t whole = crc(0, b.size() - 24);
  std::memcpy(b.data() + b.size() - 8, &whole, 4);
  return b;
}

TEST_F(CheckpointTest, HostileLengthsAreRefusedBeforeAllocating) {
  Checkpoint c;
  c.add_tensor("w", random_tensor(DataType::kFloat, {2, 2}, 9));
  c.add_tensor("s", random_tensor(DataType::kString, {2}, 10));
  const std::string p = path("c.otck");
  write_checkpoint(p, c);
  const std::string good = read_bytes(p);
  ASSERT_EQ(reseal(good), good);  // the test's understanding of the layout is right
  const std::string bad = path("bad.otck");
  auto with = [&](size_t at, const void* v, size_t n) {
    std::string b = good;
    std::memcpy(b.data() + at, v, n);
    write_bytes(bad, reseal(b));
    return read_error(bad);
  };
  // Record 0 ("w") starts at byte 32: header 24, name 1, payload: dtype, rank, dims, data.
  const int64_t huge_dim = int64_t{1} << 40;
  EXPECT_NE(with(32 + 24 + 1 + 8, &huge_dim, 8).find("needs"), std::string::npos);
  const int64_t negative = -3;
  EXPECT_NE(with(32 + 24 + 1 + 8, &negative, 8).find("negative"), std::string::npos);
  const uint32_t big_rank = 1000;
  EXPECT_NE(with(32 + 24 + 1 + 4, &big_rank, 4).find("rank 1000"), std::string::npos);
  const uint64_t huge_payload = uint64_t{1} << 62;
  EXPECT_NE(with(32 + 8, &huge_payload, 8).find("run past"), std::string::npos);
  const uint32_t huge_name = 0xffffffffu;
  EXPECT_NE(with(32 + 4, &huge_name, 4).find("run past"), std::string::npos);
  const uint64_t many_records = uint64_t{1} << 60;
  std::string b = good;
  std::memcpy(b.data() + 16, &many_records, 8);
  uint32_t hc = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(b.data()), 24));
  std::memcpy(b.data() + 24, &hc, 4);
  write_bytes(bad, reseal(b));
  EXPECT_NE(read_error(bad).find("cannot fit"), std::string::npos) << read_error(bad);
  // Record 1 ("s") string length pointing past the record.
  const size_t rec1 = 32 + 24 + 1 + 8 + 16 + 16;
  const uint64_t long_string = 1 << 20;
  EXPECT_NE(with(rec1 + 24 + 1 + 8 + 8, &long_string, 8).find("runs past the record"),
            std::string::npos);
}

TEST_F(CheckpointTest, DirectoryHelpersPickTheNewestAndPrune) {
  EXPECT_TRUE(list_checkpoints(path("missing")).empty());
  EXPECT_FALSE(load_latest_checkpoint(path("missing")).has_value());
  for (int64_t step : {5, 100, 20}) {
    Checkpoint c = sample_checkpoint();
    c.metadata["step"] = std::to_string(step);
    c.metadata[kRunIdKey] = "mine";
    write_checkpoint(path(checkpoint_file_name(step)), c);
  }
  write_bytes(path("ckpt-abc.otck"), "x");
  write_bytes(path("ckpt-.otck"), "x");
  write_bytes(path("ckpt-7.otck.tmp.99"), "x");
  write_bytes(path("ckpt-8.otck.bak"), "x");
  write_bytes(path("notes.txt"), "x");
  fs::create_directories(path("ckpt-999.otck"));
  auto files = list_checkpoints(dir_.string());
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0].step, 5);
  EXPECT_EQ(files[1].step, 20);
  EXPECT_EQ(files[2].step, 100);  // numeric, not lexicographic
  EXPECT_EQ(files[2].path, path("ckpt-100.otck"));
  auto latest = load_latest_checkpoint(dir_.string());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->ckpt.meta("step"), "100");

  // Pruning deletes only the run's own: another run's file, one without a run id and newer
  // unreadable ones (ckpt-1000..1002) stay, and never push the run's valid ones out.
  Checkpoint other = sample_checkpoint();
  other.metadata[kRunIdKey] = "theirs";
  write_checkpoint(path("ckpt-3.otck"), other);
  write_checkpoint(path("ckpt-4.otck"), sample_checkpoint());  // no run id (older format)
  for (int64_t step : {1000, 1001, 1002}) write_bytes(path(checkpoint_file_name(step)), "junk");
  auto removed = prune_checkpoints(dir_.string(), "mine", 2);
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], path("ckpt-5.otck"));
  files = list_checkpoints(dir_.string());
  ASSERT_EQ(files.size(), 7u);  // 3, 4, 20, 100, 1000..1002
  EXPECT_EQ(files[0].step, 3);
  EXPECT_EQ(files[2].step, 20);
  EXPECT_TRUE(fs::exists(path("ckpt-7.otck.tmp.99")));
  EXPECT_THROW(prune_checkpoints(dir_.string(), "mine", -1), Error);
  EXPECT_THROW(prune_checkpoints(dir_.string(), "", 1), Error);
  EXPECT_EQ(prune_checkpoints(dir_.string(), "mine", 0).size(), 2u);
  EXPECT_EQ(list_checkpoints(dir_.string()).size(), 5u);
  EXPECT_EQ(read_checkpoint_metadata(path("ckpt-3.otck")).meta(kRunIdKey), "theirs");
  EXPECT_TRUE(read_checkpoint_metadata(path("ckpt-3.otck")).tensors.empty());
  EXPECT_THROW(checkpoint_file_name(-1), Error);
}

}  // namespace
}  // namespace onnxtrain::runtime
