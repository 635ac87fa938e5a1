// Named, typed data (issue #16): .npz archives written here by a zip writer of the test's own
// (stored and deflated members, with and without numpy's zip64 extra fields), their damage,
// npz:/npy:NAME=FILE datasets fed to model inputs in the inputs' dtypes, per-token labels with
// padding, datasets without labels (a model computing its own loss), and synthetic ids.
#include <gtest/gtest.h>
#include <zlib.h>

#include <numeric>
#include <set>

#include "graph/tensor.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/npy.h"
#include "tests/dataset/test_files.h"

namespace onnxtrain::runtime {
namespace {

using graph::DataType;
using graph::Tensor;
using testing::error_of;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

void put(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::vector<uint8_t> raw_deflate(const std::vector<uint8_t>& in) {
  z_stream s{};
  EXPECT_EQ(deflateInit2(&s, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> out(deflateBound(&s, static_cast<uLong>(in.size())));
  s.next_in = const_cast<Bytef*>(in.data());
  s.avail_in = static_cast<uInt>(in.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

// A zip archive as numpy writes one: each member's local header, data, then the central
// directory. `zip64` saturates the 32-bit sizes and gives them in zip64 extra fields, as
// np.savez does (force_zip64).
std::vector<uint8_t> zip_bytes(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& members,
                               bool deflated, bool zip64) {
  std::vector<uint8_t> out, dir;
  for (const auto& [name, data] : members) {
    const std::vector<uint8_t> packed = deflated ? raw_deflate(data) : data;
    const auto crc = static_cast<uint32_t>(crc32(0, data.data(), static_cast<uInt>(data.size())));
    const uint64_t offset = out.size();
    std::vector<uint8_t> extra;
    if (zip64) {
      put(extra, 1, 2);
      put(extra, 16, 2);
      put(extra, data.size(), 8);
      put(extra, packed.size(), 8);
    }
    const uint64_t csize = zip64 ? 0xFFFFFFFF : packed.size();
    const uint64_t usize = zip64 ? 0xFFFFFFFF : data.size();
    put(out, 0x04034b50, 4);
    put(out, 45, 2);
    put(out, 0, 2);
    put(out, deflated ? 8 : 0, 2);
    put(out, 0, 4);  // time, date
    put(out, crc, 4);
    put(out, csize, 4);
    put(out, usize, 4);
    put(out, name.size(), 2);
    put(out, extra.size(), 2);
    out.insert(out.end(), name.begin(), name.end());
    out.insert(out.end(), extra.begin(), extra.end());
    out.insert(out.end(), packed.begin(), packed.end());
    put(dir, 0x02014b50, 4);
    put(dir, 45, 2);
    put(dir, 45, 2);
    put(dir, 0, 2);
    put(dir, deflated ? 8 : 0, 2);
    put(dir, 0, 4);
    put(dir, crc, 4);
    put(dir, csize, 4);
    put(dir, usize, 4);
    put(dir, name.size(), 2);
    put(dir, extra.size(), 2);
    put(dir, 0, 2);  // comment
    put(dir, 0, 2);  // disk
    put(dir, 0, 2);  // internal attributes
    put(dir, 0, 4);  // external attributes
    put(dir, offset, 4);
    dir.insert(dir.end(), name.begin(), name.end());
    dir.insert(dir.end(), extra.begin(), extra.end());
  }
  const uint64_t dir_offset = out.size();
  out.insert(out.end(), dir.begin(), dir.end());
  put(out, 0x06054b50, 4);
  put(out, 0, 4);
  put(out, members.size(), 2);
  put(out, members.size(), 2);
  put(out, dir.size(), 4);
  put(out, dir_offset, 4);
  put(out, 0, 2);
  return out;
}

// .npy bytes of `t` (written by write_npy, which the npy tests check against numpy's format).
std::vector<uint8_t> npy_bytes(const ScratchDir& dir, const Tensor& t) {
  const std::string f = dir.file("member.npy");
  write_npy(f, t);
  return read_bytes(f);
}

Tensor ints(DataType dt, std::vector<int64_t> dims, std::vector<int64_t> values) {
  Tensor t(dt, std::move(dims));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dt == DataType::kInt64) t.mutable_data_as<int64_t>()[i] = values[i];
    if (dt == DataType::kInt32) t.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(values[i]);
    if (dt == DataType::kBool) t.mutable_data_as<uint8_t>()[i] = static_cast<uint8_t>(values[i]);
  }
  return t;
}

// 6 examples of 4 tokens: ids (int32 on disk), a bool mask, per-token labels with padding -100.
struct TokenArchive {
  Tensor ids = ints(DataType::kInt32, {6, 4}, [] {
    std::vector<int64_t> v(24);
    std::iota(v.begin(), v.end(), 0);
    return v;
  }());
  Tensor mask = ints(DataType::kBool, {6, 4}, {1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 1,
                                               1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0});
  Tensor labels = ints(DataType::kInt64, {6, 4}, {1, 2, 3, -100, 5, 6, -100, -100, 0, 1, 2, 3,
                                                  4, -100, -100, -100, 5, 6, 7, 8, 9, 0, -100, -100});

  std::string write(const ScratchDir& dir, const std::string& name, bool deflated, bool zip64,
                    const std::string& labels_name = "labels") const {
    const std::string path = dir.file(name);
    write_bytes(path, zip_bytes({{"input_ids.npy", npy_bytes(dir, ids)},
                                 {"attention_mask.npy", npy_bytes(dir, mask)},
                                 {labels_name + ".npy", npy_bytes(dir, labels)}},
                                deflated, zip64));
    return path;
  }
};

std::vector<ModelInput> token_inputs() {
  return {{"input_ids", DataType::kInt64, {4}, 24}, {"attention_mask", DataType::kInt64, {-1}, 0}};
}

LoadOptions token_options() {
  LoadOptions o;
  o.inputs = token_inputs();
  o.padding_label = -100;
  return o;
}

TEST(Npz, StoredDeflatedAndZip64MembersReadBack) {
  ScratchDir dir("npz_read");
  const TokenArchive a;
  for (bool deflated : {false, true})
    for (bool zip64 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "deflated " << deflated << " zip64 " << zip64);
      const auto arrays = read_npz(a.write(dir, "a.npz", deflated, zip64));
      ASSERT_EQ(arrays.size(), 3u);
      EXPECT_EQ(arrays[0].first, "input_ids");
      EXPECT_EQ(arrays[1].first, "attention_mask");
      EXPECT_EQ(arrays[2].first, "labels");
      EXPECT_EQ(arrays[0].second.dtype(), DataType::kInt32);
      EXPECT_EQ(arrays[0].second.dims(), (std::vector<int64_t>{6, 4}));
      EXPECT_EQ(arrays[0].second.data_as<int32_t>()[23], 23);
      EXPECT_EQ(arrays[1].second.dtype(), DataType::kBool);
      EXPECT_EQ(arrays[2].second.data_as<int64_t>()[3], -100);
      std::optional<Tensor> one = read_npz_array(dir.file("a.npz"), "attention_mask");
      ASSERT_TRUE(one.has_value());
      EXPECT_EQ(one->dims(), (std::vector<int64_t>{6, 4}));
      EXPECT_FALSE(read_npz_array(dir.file("a.npz"), "nothing").has_value());
    }
}

TEST(Npz, DamageIsOneLineNamingTheFileAndMember) {
  ScratchDir dir("npz_damage");
  const TokenArchive a;
  const std::string path = a.write(dir, "a.npz", false, true);
  std::vector<uint8_t> bytes = read_bytes(path);
  // A flipped byte inside the first member's array data: its CRC-32 no longer matches.
  std::vector<uint8_t> flipped = bytes;
  flipped[30 + 13 + 20 + 140] ^= 0x40;
  write_bytes(dir.file("crc.npz"), flipped);
  std::string e = error_of([&] { read_npz(dir.file("crc.npz")); });
  EXPECT_NE(e.find("crc.npz:input_ids.npy: CRC-32 mismatch"), std::string::npos) << e;
  // Cut off: no end-of-central-directory record any more.
  write_bytes(dir.file("cut.npz"), {bytes.begin(), bytes.begin() + static_cast<long>(bytes.size() / 2)});
  e = error_of([&] { read_npz(dir.file("cut.npz")); });
  EXPECT_NE(e.find("cut.npz: not a .npz file"), std::string::npos) << e;
  // A directory entry pointing past the end of the file.
  std::vector<uint8_t> far = bytes;
  const size_t eocd = far.size() - 22;
  const size_t dir_at = far[eocd + 16] | (far[eocd + 17] << 8) | (far[eocd + 18] << 16);
  far[dir_at + 42 + 3] = 0x7F;  // the first member's local header offset, high byte
  write_bytes(dir.file("far.npz"), far);
  e = error_of([&] { read_npz(dir.file("far.npz")); });
  EXPECT_NE(e.find("far.npz: the local header of 'input_ids.npy'"), std::string::npos) << e;
  // Deflate data that does not inflate.
  const std::string d = a.write(dir, "d.npz", true, false);
  std::vector<uint8_t> dbytes = read_bytes(d);
  for (size_t i = 30 + 13; i < 30 + 13 + 8; ++i) dbytes[i] = 0xFF;
  write_bytes(d, dbytes);
  e = error_of([&] { read_npz(d); });
  EXPECT_TRUE(e.find("d.npz:input_ids.npy: corrupt deflate data") != std::string::npos ||
              e.find("CRC-32") != std::string::npos)
      << e;
  e = error_of([&] { read_npz(dir.file("missing.npz")); });
  EXPECT_NE(e.find("missing.npz: file not found"), std::string::npos) << e;
}

TEST(NamedData, ArraysFeedInputsInTheirDtypes) {
  ScratchDir dir("named_feed");
  const TokenArchive a;
  const std::string path = a.write(dir, "a.npz", true, true);
  LoadedData d = load_dataset(parse_data_spec("npz:" + path), token_options());
  ASSERT_TRUE(d.train.is_named());
  EXPECT_EQ(d.train.size(), 6);
  // A bare FILE.npz (any case) is npz:FILE; FILE.csv is images:FILE.csv; other names still fail.
  const DataSpec bare = parse_data_spec(path);
  EXPECT_EQ(bare.kind, DataSpec::Kind::kNpz);
  EXPECT_EQ(bare.path, path);
  EXPECT_EQ(bare.text, path);
  EXPECT_EQ(load_dataset(bare, token_options()).train.size(), 6);
  EXPECT_EQ(parse_data_spec("Y.NPZ").kind, DataSpec::Kind::kNpz);
  EXPECT_EQ(parse_data_spec("list.csv").kind, DataSpec::Kind::kImages);
  EXPECT_NE(error_of([] { parse_data_spec("a.npzx"); }).find("unknown kind"), std::string::npos);
  EXPECT_EQ(d.train.label_shape(), std::vector<int64_t>{4});
  EXPECT_EQ(d.train.num_classes(), 10);
  ASSERT_EQ(d.train.arrays().size(), 2u);
  EXPECT_EQ(d.train.arrays()[0].first, "input_ids");  // the model's input order
  EXPECT_EQ(d.train.arrays()[0].second.dtype(), DataType::kInt64);  // int32 on disk
  EXPECT_EQ(d.train.arrays()[1].second.dtype(), DataType::kInt64);  // bool on disk
  // Batches: rows follow the shuffled indices in every array, labels too.
  DataLoader loader(d.train, InputAdapter::for_dataset(d.train, {}), {.batch_size = 4, .seed = 3});
  Batch b = loader.next();
  ASSERT_EQ(b.named.size(), 2u);
  ASSERT_EQ(b.targets.dims(), (std::vector<int64_t>{4, 4}));
  for (int64_t i = 0; i < b.size(); ++i) {
    const int64_t k = b.indices[static_cast<size_t>(i)];
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(b.named[0].second.data_as<int64_t>()[i * 4 + j], k * 4 + j);
      EXPECT_EQ(b.named[1].second.data_as<int64_t>()[i * 4 + j], a.mask.data_as<uint8_t>()[k * 4 + j]);
      EXPECT_EQ(b.targets.data_as<int64_t>()[i * 4 + j], a.labels.data_as<int64_t>()[k * 4 + j]);
    }
  }
  // Shards slice every array alike.
  std::vector<Batch> parts = shard(b, 3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].named[0].second.dims()[0], 1);
  EXPECT_EQ(parts[2].named[0].second.data_as<int64_t>()[0], b.indices[3] * 4);
  // The same from separate .npy files.
  write_npy(dir.file("ids.npy"), a.ids);
  write_npy(dir.file("mask.npy"), a.mask);
  write_npy(dir.file("y.npy"), a.labels);
  LoadedData n = load_dataset(parse_data_spec(cat("npy:input_ids=", dir.file("ids.npy"),
                                                  ",attention_mask=", dir.file("mask.npy"),
                                                  ",labels=", dir.file("y.npy"))),
                              token_options());
  EXPECT_EQ(n.train.arrays()[1].second.data_as<int64_t>()[3], 0);
}

// npy:X,Y with a float image input and a per-pixel mask (N,H,W) as Y (semantic segmentation):
// the named path feeds X to the model's one input and keeps the labels per pixel; (N) labels
// stay the plain classification path.
TEST(NamedData, NpyPairWithPerPixelLabels) {
  ScratchDir dir("npy_mask");
  std::vector<float> xs(5 * 3 * 2 * 2);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i);
  std::vector<int64_t> mask(5 * 2 * 2);
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<int64_t>(i % 4);
  write_npy(dir.file("x.npy"), Tensor::from_vector(DataType::kFloat, {5, 3, 2, 2}, xs));
  write_npy(dir.file("mask.npy"), Tensor::from_vector(DataType::kInt64, {5, 2, 2}, mask));
  LoadOptions o;
  o.inputs = {{"input", DataType::kFloat, {3, 2, 2}, 0}};
  LoadedData d = load_dataset(
      parse_data_spec(cat("npy:", dir.file("x.npy"), ",", dir.file("mask.npy"))), o);
  ASSERT_TRUE(d.train.is_named());
  EXPECT_EQ(d.train.size(), 5);
  EXPECT_EQ(d.train.label_shape(), (std::vector<int64_t>{2, 2}));
  ASSERT_EQ(d.train.arrays().size(), 1u);
  EXPECT_EQ(d.train.arrays()[0].first, "input");
  EXPECT_EQ(d.train.arrays()[0].second.data_as<float>()[13], 13.0f);
  write_npy(dir.file("y.npy"), Tensor::from_vector(DataType::kInt64, {5}, std::vector<int64_t>{0, 1, 2, 3, 0}));
  LoadedData c = load_dataset(
      parse_data_spec(cat("npy:", dir.file("x.npy"), ",", dir.file("y.npy"))), o);
  EXPECT_FALSE(c.train.is_named());
  EXPECT_EQ(c.train.size(), 5);
}

TEST(NamedData, MismatchesNameTheArrayAndTheInput) {
  ScratchDir dir("named_errors");
  TokenArchive a;
  const std::string path = a.write(dir, "a.npz", false, true);
  LoadOptions o = token_options();
  // A float32 input takes the integer ids; int8 ids cannot take floats.
  o.inputs[0].dtype = DataType::kInt8;
  std::string e = error_of([&] { load_dataset(parse_data_spec("npz:" + path), o); });
  EXPECT_NE(e.find("a.npz:input_ids: dtype i32 does not fit model input 'input_ids' [N,4] i8"),
            std::string::npos)
      << e;
  o = token_options();
  o.inputs[0].dims = {5};
  e = error_of([&] { load_dataset(parse_data_spec("npz:" + path), o); });
  EXPECT_NE(e.find("a.npz:input_ids: shape (6,4) does not fit model input 'input_ids' [N,5] i64"),
            std::string::npos)
      << e;
  o = token_options();
  o.inputs.push_back({"token_type_ids", DataType::kInt64, {4}, 2});
  e = error_of([&] { load_dataset(parse_data_spec("npz:" + path), o); });
  EXPECT_NE(e.find("no array for model input 'token_type_ids' [N,4] i64"), std::string::npos) << e;
  o = token_options();
  o.inputs.pop_back();
  e = error_of([&] { load_dataset(parse_data_spec("npz:" + path), o); });
  EXPECT_NE(e.find("array 'attention_mask' feeds no model input"), std::string::npos) << e;
  o = token_options();
  o.labels_name = "y";
  e = error_of([&] { load_dataset(parse_data_spec("npz:" + path), o); });
  EXPECT_NE(e.find("no array named 'y' for the labels"), std::string::npos) << e;
  o = token_options();
  o.padding_label.reset();
  e = error_of([&] { load_dataset(parse_data_spec("npz:" + path), o); });
  EXPECT_NE(e.find("label -100 of example 0 (element 3) is negative"), std::string::npos) << e;
  // Float ids for an integer input are refused, not rounded.
  a.ids = Tensor(DataType::kFloat, {6, 4});
  const std::string f = a.write(dir, "f.npz", false, false);
  e = error_of([&] { load_dataset(parse_data_spec("npz:" + f), token_options()); });
  EXPECT_NE(e.find("f.npz:input_ids: dtype f32 does not fit model input 'input_ids' [N,4] i64"),
            std::string::npos)
      << e;
  // Another labels name, and the out-of-range check names the element.
  const std::string y = TokenArchive().write(dir, "y.npz", false, false, "targets");
  o = token_options();
  o.labels_name = "targets";
  LoadedData d = load_dataset(parse_data_spec("npz:" + y), o);
  e = error_of([&] { d.train.check_labels(9); });
  EXPECT_NE(e.find("label 9 of example 5 (element 0) is out of range for a model with 9 classes"),
            std::string::npos)
      << e;
  e = error_of([&] { parse_data_spec("npy:a=x.npy,a=y.npy"); });
  EXPECT_NE(e.find("array 'a' is given twice"), std::string::npos) << e;
  e = error_of([&] { parse_data_spec("npy:a=x.npy,y.npy"); });
  EXPECT_NE(e.find("'y.npy' is not NAME=FILE"), std::string::npos) << e;
}

TEST(NamedData, WithoutLabelsEveryArrayFeedsAnInput) {
  ScratchDir dir("named_nolabels");
  const std::string path = TokenArchive().write(dir, "a.npz", false, true);
  LoadOptions o = token_options();
  o.inputs.push_back({"labels", DataType::kInt64, {4}, 0});
  o.labels_name = "";  // the model computes its own loss from "labels"
  LoadedData d = load_dataset(parse_data_spec("npz:" + path), o);
  EXPECT_FALSE(d.train.has_truth());
  EXPECT_EQ(d.train.arrays().size(), 3u);
  DataLoader loader(d.train, InputAdapter(), {.batch_size = 6, .shuffle = false});
  Batch b = loader.next();
  EXPECT_EQ(b.targets.rank(), 0u);
  ASSERT_EQ(b.named.size(), 3u);
  EXPECT_EQ(b.named[2].first, "labels");
  EXPECT_EQ(b.rows(4, 2).named[2].second.data_as<int64_t>()[0], 5);
}

TEST(NamedData, SyntheticIdsStayBelowTheTableAndMasksAreOnes) {
  LoadOptions o;
  o.inputs = {{"input_ids", DataType::kInt64, {8}, 37},
              {"attention_mask", DataType::kInt32, {8}, 0},
              {"pixel_values", DataType::kFloat, {2}, 0}};
  o.label_dims = {8};
  o.num_classes = 5;
  o.seed = 4;
  LoadedData d = load_dataset(parse_data_spec("synthetic:50"), o);
  ASSERT_TRUE(d.train.is_named());
  const Tensor& ids = d.train.arrays()[0].second;
  std::set<int64_t> seen;
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t v = ids.data_as<int64_t>()[i];
    EXPECT_TRUE(v >= 0 && v < 37) << v;
    seen.insert(v);
  }
  EXPECT_GT(seen.size(), 30u);  // spread over the table, not one id
  const Tensor& mask = d.train.arrays()[1].second;
  EXPECT_EQ(mask.dtype(), DataType::kInt32);
  for (int64_t i = 0; i < mask.numel(); ++i) EXPECT_EQ(mask.data_as<int32_t>()[i], 1);
  EXPECT_EQ(d.train.label_shape(), std::vector<int64_t>{8});
  EXPECT_LE(d.train.num_classes(), 5);
  o.inputs[0].dims = {-1};
  const std::string e = error_of([&] { load_dataset(parse_data_spec("synthetic:5"), o); });
  EXPECT_NE(e.find("has a dimension of no fixed size"), std::string::npos) << e;
}

TEST(NamedData, LabelFactsDecideAutoLossAndClassAxis) {
  ScratchDir dir("named_auto");
  const std::string path = TokenArchive().write(dir, "a.npz", false, false);
  auto tokens = label_facts(parse_data_spec("npz:" + path), "labels");
  ASSERT_TRUE(tokens.has_value());
  EXPECT_TRUE(tokens->integer);
  EXPECT_EQ(tokens->example_dims, std::vector<int64_t>{4});  // per token: (6, 4) labels
  write_npy(dir.file("x.npy"), Tensor(DataType::kFloat, {3, 2}));
  write_npy(dir.file("y.npy"), Tensor(DataType::kFloat, {3, 1}));
  auto targets =
      label_facts(parse_data_spec(cat("npy:", dir.file("x.npy"), ",", dir.file("y.npy"))), "labels");
  ASSERT_TRUE(targets.has_value());
  EXPECT_FALSE(targets->integer);
  EXPECT_EQ(targets->example_dims, std::vector<int64_t>{1});
  EXPECT_FALSE(label_facts(parse_data_spec("fashion-mnist"), "labels").has_value());
  EXPECT_FALSE(label_facts(parse_data_spec("npz:" + path), "nothing").has_value());
}

}  // namespace
}  // namespace onnxtrain::runtime
