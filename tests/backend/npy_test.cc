// .npy and TensorProto .pb files: round trips for every dtype, files as numpy writes them, and
// hostile files that must give an error naming the file (never a crash or a huge allocation).
#include "runtime/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/error.h"
#include "onnx/onnx_pb.h"
#include "tests/cli/cli_support.h"

namespace onnxtrain::runtime {
namespace {

namespace fs = std::filesystem;
using graph::DataType;
using graph::Tensor;

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           cat("onnxtrain_npy_", ::getpid(), "_",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write_bytes(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  // The error read_npy throws for `bytes` (fails the test when it does not throw).
  std::string npy_error(const std::string& bytes) const {
    std::string p = write_bytes("bad.npy", bytes);
    try {
      read_npy(p);
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << "error does not name the file: " << msg;
      return msg;
    }
    ADD_FAILURE() << "read_npy accepted a hostile file";
    return "";
  }

  fs::path dir_;
};

// A v1.0 .npy exactly as np.save writes it: header padded with spaces to 64 bytes total.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
  std::string header = dict;
  size_t prelude = major == 1 ? 10 : 12;
  size_t total = prelude + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  uint32_t len = static_cast<uint32_t>(header.size());
  for (size_t i = 0; i < prelude - 8; ++i) out.push_back(static_cast<char>(len >> (8 * i)));
  return out + header + data;
}

template <typename T>
Tensor make(DataType dt, std::vector<int64_t> dims, std::vector<T> values) {
  return Tensor::from_vector(dt, std::move(dims), values);
}

TEST_F(NpyTest, RoundTripsEveryDtype) {
  std::vector<Tensor> cases = {
      make<float>(DataType::kFloat, {2, 3}, {1.5f, -2, 0, 3e38f, -1e-38f, 7}),
      make<double>(DataType::kDouble, {3}, {1e300, -0.25, 3}),
      make<uint16_t>(DataType::kFloat16, {2, 2}, {0x3c00, 0xc000, 0x7c00, 0x0001}),
      make<int8_t>(DataType::kInt8, {4}, {-128, 127, 0, -1}),
      make<int16_t>(DataType::kInt16, {2}, {-32768, 32767}),
      make<int32_t>(DataType::kInt32, {1, 2, 1}, {-7, 1 << 30}),
      make<int64_t>(DataType::kInt64, {2}, {int64_t{1} << 62, -3}),
      make<uint8_t>(DataType::kUInt8, {3}, {0, 128, 255}),
      make<uint16_t>(DataType::kUInt16, {2}, {0, 65535}),
      make<uint32_t>(DataType::kUInt32, {2}, {0, 4000000000u}),
      make<uint64_t>(DataType::kUInt64, {1}, {~uint64_t{0}}),
      make<uint8_t>(DataType::kBool, {2, 2}, {1, 0, 0, 1}),
      make<float>(DataType::kFloat, {}, {42}),  // scalar: shape ()
      Tensor(DataType::kFloat, {0, 5}),         // empty
  };
  for (const Tensor& t : cases) {
    SCOPED_TRACE(cat(graph::dtype_short_name(t.dtype()), " rank ", t.rank()));
    std::string p = path("t.npy");
    write_npy(p, t);
    EXPECT_EQ(fs::file_size(p) % 64, t.nbytes() % 64) << "data should start 64-byte aligned";
    Tensor back = read_npy(p);
    EXPECT_TRUE(back.equals(t));
    EXPECT_TRUE(read_tensor_file(p).equals(t));
  }
  EXPECT_FALSE(fs::exists(path("t.npy.tmp." + std::to_string(::getpid()))));
}

TEST_F(NpyTest, WritesTheHeaderNumpyWrites) {
  write_npy(path("a.npy"), make<float>(DataType::kFloat, {2, 3}, {1, 2, 3, 4, 5, 6}));
  std::string bytes = cli_test::read_file(path("a.npy"));
  ASSERT_EQ(bytes.size(), 128u + 24u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(bytes.substr(10, 59), "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
  EXPECT_EQ(bytes[127], '\n');
  write_npy(path("b.npy"), make<uint8_t>(DataType::kBool, {5}, {1, 0, 1, 0, 1}));
  EXPECT_NE(cli_test::read_file(path("b.npy")).find("'descr': '|b1'"), std::string::npos);
  EXPECT_NE(cli_test::read_file(path("b.npy")).find("'shape': (5,)"), std::string::npos);
}

// Bytes np.save(np.arange(6, dtype='<i8').reshape(2, 3)) produces (numpy 1.x and 2.x alike).
TEST_F(NpyTest, ReadsNumpyBytes) {
  std::string data;
  for (int64_t v = 0; v < 6; ++v) data.append(reinterpret_cast<const char*>(&v), 8);
  std::string p = write_bytes(
      "np.npy", npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }", data));
  Tensor t = read_npy(p);
  EXPECT_EQ(t.dtype(), DataType::kInt64);
  EXPECT_EQ(t.dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.data_as<int64_t>()[5], 5);
  // Format 2.0 and 3.0 (u32 header length), a key order numpy never writes, and '=' order.
  float one = 1;
  std::string f(reinterpret_cast<const char*>(&one), 4);
  for (int major : {2, 3}) {
    Tensor u = read_npy(write_bytes(
        "v.npy", npy_bytes("{\"shape\": (1,), 'fortran_order': False, 'descr': '=f4'}", f, major)));
    EXPECT_EQ(u.dims(), std::vector<int64_t>{1});
    EXPECT_EQ(u.data_as<float>()[0], 1.0f);
  }
}

TEST_F(NpyTest, ReadsFilesNumpyWrote) {
  if (!cli_test::python_available() ||
      cli_test::run_process({"python3", "-c", "import numpy"}, dir_).rc != 0)
    GTEST_SKIP() << "python3 with numpy not available";
  std::string script =
      cat("import numpy as np\n"
          "np.save('",
          path("f.npy"), "', np.arange(12, dtype=np.float32).reshape(3, 4) / 4)\n", "np.save('",
          path("h.npy"), "', np.array([1.5, -2], dtype=np.float16))\n", "np.save('", path("b.npy"),
          "', np.array([[True, False]]))\n", "np.save('", path("s.npy"), "', np.int64(-9))\n",
          "np.save('", path("fo.npy"), "', np.asfortranarray(np.ones((2, 3))))\n", "np.save('",
          path("be.npy"), "', np.ones(3, dtype='>f4'))\n", "a = np.load('", path("mine.npy"),
          "'); assert a.dtype == np.int16 and a.shape == (2, 2)\n",
          "assert (a == [[1, -2], [3, -4]]).all()\n");
  write_npy(path("mine.npy"), make<int16_t>(DataType::kInt16, {2, 2}, {1, -2, 3, -4}));
  std::ofstream(path("gen.py")) << script;
  auto r = cli_test::run_process({"python3", path("gen.py")}, dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  Tensor f = read_npy(path("f.npy"));
  EXPECT_EQ(f.dims(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(f.data_as<float>()[11], 2.75f);
  EXPECT_EQ(read_npy(path("h.npy")).data_as<uint16_t>()[0], 0x3e00);
  EXPECT_EQ(read_npy(path("b.npy")).dtype(), DataType::kBool);
  EXPECT_EQ(read_npy(path("s.npy")).rank(), 0);
  EXPECT_THROW(read_npy(path("fo.npy")), Error);
  EXPECT_THROW(read_npy(path("be.npy")), Error);
}

TEST_F(NpyTest, RefusesFortranOrderAndBigEndian) {
  std::string msg = npy_error(npy_bytes(
      "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 2), }", std::string(32, '\0')));
  EXPECT_NE(msg.find("fortran_order=True is not supported"), std::string::npos) << msg;
  msg = npy_error(
      npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0')));
  EXPECT_NE(msg.find("'>f4' is big-endian"), std::string::npos) << msg;
  msg = npy_error(
      npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", std::string(8, '\0')));
  EXPECT_NE(msg.find("'<c8' is not supported"), std::string::npos) << msg;
  msg = npy_error(npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",
                            std::string(4, '\0')));
  EXPECT_NE(msg.find("structured dtypes"), std::string::npos) << msg;
}

TEST_F(NpyTest, HostileFilesGiveErrorsWithOffsets) {
  const std::string good =
      npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", std::string(16, '\0'));
  // Not a .npy at all / cut inside the magic.
  EXPECT_NE(npy_error("hello").find("not a .npy file"), std::string::npos);
  EXPECT_NE(npy_error("").find("not a .npy file"), std::string::npos);
  // Cut right after the magic and inside the header length field.
  EXPECT_NE(npy_error(good.substr(0, 6)).find("truncated at offset 6"), std::string::npos);
  EXPECT_NE(npy_error(good.substr(0, 9)).find("truncated at offset 9"), std::string::npos);
  // Unknown format version.
  std::string v9 = good;
  v9[6] = 9;
  EXPECT_NE(npy_error(v9).find("format version 9.0 at offset 6"), std::string::npos);
  // Truncated header: the length field promises more than the file holds.
  std::string msg = npy_error(good.substr(0, 40));
  EXPECT_NE(msg.find("header length 118 at offset 8 runs past the end of the file (40 bytes)"),
            std::string::npos)
      << msg;
  // Header length past EOF with a v2 u32 field near 4 GiB: refused before any allocation.
  std::string huge = "\x93NUMPY\x02";
  huge += std::string("\0\xff\xff\xff\xf0", 5);
  msg = npy_error(huge + "{}");
  EXPECT_NE(msg.find("at offset 8 exceeds the limit"), std::string::npos) << msg;
  // Header syntax errors point into the header.
  msg = npy_error(npy_bytes("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4,), }", ""));
  EXPECT_NE(msg.find(".npy header at offset 44: expected True or False"), std::string::npos) << msg;
  msg = npy_error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,) ", ""));
  EXPECT_NE(msg.find("expected ',' or '}'"), std::string::npos) << msg;
  msg = npy_error(npy_bytes("{'descr': '<f4', 'fortran_order': False}", ""));
  EXPECT_NE(msg.find("header has no 'shape'"), std::string::npos) << msg;
  msg = npy_error(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }", ""));
  EXPECT_NE(msg.find("expected a non-negative integer"), std::string::npos) << msg;
  msg = npy_error(npy_bytes(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", ""));
  EXPECT_NE(msg.find("dimension does not fit in int64"), std::string::npos) << msg;
  // Shape product overflows int64: refused before allocating.
  msg = npy_error(npy_bytes(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4), }", ""));
  EXPECT_NE(msg.find("element count overflows int64"), std::string::npos) << msg;
  // A product that fits elements but not bytes.
  msg = npy_error(
      npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,), }", ""));
  EXPECT_NE(msg.find("overflows int64 bytes"), std::string::npos) << msg;
  // Data shorter than the shape needs: a huge shape on a tiny file never allocates.
  msg = npy_error(
      npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }", "abcd"));
  EXPECT_NE(msg.find(".npy data at offset 128 holds 4 bytes but shape (100000, 100000) of '<f4' "
                     "needs 40000000000"),
            std::string::npos)
      << msg;
  msg = npy_error(good.substr(0, good.size() - 1));
  EXPECT_NE(msg.find("holds 15 bytes but shape (4,) of '<f4' needs 16"), std::string::npos) << msg;
  msg = npy_error(good + "xx");
  EXPECT_NE(msg.find("2 unexpected trailing bytes at offset 144"), std::string::npos) << msg;
}

TEST_F(NpyTest, MissingFileAndUnknownExtension) {
  try {
    read_npy(path("nope.npy"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.npy: file not found"), std::string::npos);
  }
  try {
    read_tensor_file(path("x.txt"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown tensor file extension '.txt'"),
              std::string::npos);
  }
  Tensor s(DataType::kString, {1});
  try {
    write_npy(path("s.npy"), s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write dtype str"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(path("s.npy")));
  EXPECT_FALSE(npy_supports(DataType::kBFloat16));
  EXPECT_TRUE(npy_supports(DataType::kFloat16));
}

TEST_F(NpyTest, ReadsTensorProtoFiles) {
  onnx::TensorProto raw;
  raw.set_name("x");
  raw.set_data_type(onnx::TensorProto::FLOAT);
  raw.add_dims(2);
  float vals[2] = {1.5f, -3};
  raw.set_raw_data(std::string(reinterpret_cast<const char*>(vals), 8));
  Tensor t = read_tensor_file(write_bytes("raw.pb", raw.SerializeAsString()));
  EXPECT_EQ(t.dims(), std::vector<int64_t>{2});
  EXPECT_EQ(t.data_as<float>()[1], -3.0f);

  onnx::TensorProto typed;
  typed.set_data_type(onnx::TensorProto::INT64);
  typed.add_dims(1);
  typed.add_dims(3);
  for (int64_t v : {4, -5, 6}) typed.add_int64_data(v);
  t = read_tensor_pb(write_bytes("typed.pb", typed.SerializeAsString()));
  EXPECT_EQ(t.dtype(), DataType::kInt64);
  EXPECT_EQ(t.data_as<int64_t>()[1], -5);

  onnx::TensorProto b;
  b.set_data_type(onnx::TensorProto::BOOL);
  b.add_dims(2);
  b.add_int32_data(1);
  b.add_int32_data(0);
  t = read_tensor_pb(write_bytes("b.pb", b.SerializeAsString()));
  EXPECT_EQ(t.data_as<uint8_t>()[0], 1);

  onnx::TensorProto s;
  s.set_data_type(onnx::TensorProto::STRING);
  s.add_dims(2);
  s.add_string_data("a");
  s.add_string_data("bc");
  t = read_tensor_pb(write_bytes("s.pb", s.SerializeAsString()));
  EXPECT_EQ(t.strings()[1], "bc");
}

TEST_F(NpyTest, HostileTensorProtoFiles) {
  auto error_of = [&](const std::string& bytes) -> std::string {
    std::string p = write_bytes("bad.pb", bytes);
    try {
      read_tensor_pb(p);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "accepted";
    return "";
  };
  EXPECT_NE(error_of("\xff\xff\xff").find("not a valid ONNX TensorProto"), std::string::npos);
  onnx::TensorProto p;
  p.set_data_type(onnx::TensorProto::FLOAT);
  p.add_dims(100000);
  p.add_dims(1000);
  std::string msg = error_of(p.SerializeAsString());  // big dims, no data: no allocation
  EXPECT_NE(msg.find("holds 0 values but dims need 100000000"), std::string::npos) << msg;
  p.add_dims(1000000);
  msg = error_of(p.SerializeAsString());
  EXPECT_NE(msg.find("exceed the tensor size cap"), std::string::npos) << msg;
  p.clear_dims();
  p.add_dims(2);
  p.set_raw_data("abcd");
  msg = error_of(p.SerializeAsString());
  EXPECT_NE(msg.find("raw_data has 4 bytes"), std::string::npos) << msg;
  p.clear_dims();
  p.add_dims(int64_t{1} << 40);
  p.add_dims(int64_t{1} << 40);
  msg = error_of(p.SerializeAsString());
  EXPECT_NE(msg.find("overflows int64"), std::string::npos) << msg;
  p.clear_dims();
  p.add_dims(-1);
  msg = error_of(p.SerializeAsString());
  EXPECT_NE(msg.find("negative"), std::string::npos) << msg;
  p.clear_dims();
  p.set_data_type(12345);
  msg = error_of(p.SerializeAsString());
  EXPECT_NE(msg.find("unknown data type 12345"), std::string::npos) << msg;
}

}  // namespace
}  // namespace onnxtrain::runtime
