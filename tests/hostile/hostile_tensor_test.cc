// Hostile-input tests of tensor data: external-data paths that try to leave the model's folder,
// bad offsets and lengths, and dims, sizes and dtypes that do not add up.
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/hostile/hostile_harness.h"

namespace onnxtrain::hostile {
namespace {

// ---------------------------------------------------------------- external data paths

TEST_F(Hostile, ExternalAbsoluteLocation) {
  std::string abs = (dir_ / "w.bin").string();
  expect_rejected(write_model(external_model(abs.c_str(), nullptr, nullptr)),
                  {"tensor 'w'", "is absolute"});
}

TEST_F(Hostile, ExternalDotDotLocation) {
  expect_rejected(write_model(external_model("../secret.bin", nullptr, nullptr)),
                  {"tensor 'w'", "'../secret.bin'", "contains '..'"});
}

TEST_F(Hostile, ExternalDotDotInsideLocation) {
  fs::create_directories(dir_ / "sub");
  expect_rejected(write_model(external_model("sub/../../x", nullptr, nullptr)),
                  {"tensor 'w'", "contains '..'"});
}

TEST_F(Hostile, ExternalSymlinkToFileOutside) {
  fs::create_symlink(root_ / "outside" / "secret.bin", dir_ / "link.bin");
  expect_rejected(write_model(external_model("link.bin", nullptr, nullptr)),
                  {"tensor 'w'", "'link.bin'", "outside the model's folder"});
}

TEST_F(Hostile, ExternalSymlinkedFolderOutside) {
  fs::create_directory_symlink(root_ / "outside", dir_ / "ext");
  expect_rejected(write_model(external_model("ext/secret.bin", nullptr, nullptr)),
                  {"tensor 'w'", "outside the model's folder"});
}

// The model named relative to the working directory: the folder check must still hold.
TEST_F(Hostile, ExternalSymlinkWithRelativeModelPath) {
  fs::create_symlink(root_ / "outside" / "secret.bin", dir_ / "link.bin");
  write_model(external_model("link.bin", nullptr, nullptr));
  ChildResult r = run_forked(
      [&] {
        if (chdir(dir_.c_str()) != 0) return std::string("chdir failed");
        return load_outcome([] { graph::import_onnx_file("model.onnx"); });
      },
      root_);
  ASSERT_TRUE(r.exited && r.code == 0) << r.describe();
  EXPECT_EQ(r.out.rfind("Emodel.onnx: ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("outside the model's folder"), std::string::npos) << r.out;
}

TEST_F(Hostile, ExternalMissingFile) {
  expect_rejected(write_model(external_model("missing.bin", nullptr, nullptr)),
                  {"tensor 'w'", "'missing.bin' not found"});
}

TEST_F(Hostile, ExternalWithoutLocation) {
  expect_rejected(write_model(external_model(nullptr, "0", "16")),
                  {"tensor 'w'", "has no 'location'"});
}

TEST_F(Hostile, ExternalLocationIsAFolder) {
  fs::create_directories(dir_ / "sub");
  expect_rejected(write_model(external_model("sub", nullptr, nullptr)),
                  {"tensor 'w'", "is not a regular file"});
}

TEST_F(Hostile, ExternalNeedsAFileToResolveAgainst) {
  std::string bytes;
  ASSERT_TRUE(external_model("w.bin", nullptr, nullptr).SerializeToString(&bytes));
  std::string o = load_outcome([&] { graph::import_onnx_bytes(bytes, "mem.onnx", ""); });
  EXPECT_EQ(o.rfind("Emem.onnx: ", 0), 0u) << o;
  EXPECT_NE(o.find("needs a model file to resolve against"), std::string::npos) << o;
}

// ---------------------------------------------------------------- external data offsets

TEST_F(Hostile, ExternalOffsetPastEnd) {
  expect_rejected(write_model(external_model("w.bin", "100", nullptr)),
                  {"tensor 'w'", "offset 100 is past the end", "(16 bytes)"});
}

TEST_F(Hostile, ExternalOffsetPlusLengthPastEnd) {
  expect_rejected(write_model(external_model("w.bin", "8", "16")),
                  {"tensor 'w'", "offset 8 + length 16 is past the end"});
}

TEST_F(Hostile, ExternalLengthDoesNotMatchDims) {
  expect_rejected(write_model(external_model("w.bin", "0", "8")),
                  {"tensor 'w'", "length 8 does not match dims (16 bytes expected)"});
}

TEST_F(Hostile, ExternalFileShorterThanDims) {
  expect_rejected(write_model(external_model("w.bin", nullptr, nullptr, {8})),
                  {"tensor 'w'", "length 16 does not match dims (32 bytes expected)"});
}

TEST_F(Hostile, ExternalNonNumericOffset) {
  expect_rejected(write_model(external_model("w.bin", "abc", "16")),
                  {"tensor 'w'", "'offset' is not a non-negative integer ('abc')"});
}

TEST_F(Hostile, ExternalNegativeLength) {
  expect_rejected(write_model(external_model("w.bin", "0", "-4")),
                  {"tensor 'w'", "'length' is not a non-negative integer ('-4')"});
}

TEST_F(Hostile, ExternalOffsetOverflowsInt64) {
  expect_rejected(write_model(external_model("w.bin", "99999999999999999999999", nullptr)),
                  {"tensor 'w'", "'offset' is not a non-negative integer"});
}

// A 1 GiB tensor whose data file holds 16 bytes: refused before the 1 GiB buffer is allocated.
TEST_F(Hostile, ExternalHugeDimsSmallFileAllocatesNothing) {
  expect_rejected(write_model(external_model("w.bin", nullptr, nullptr, {int64_t{1} << 28})),
                  {"tensor 'w'", "does not match dims"});
}

TEST_F(Hostile, ExternalStringTensor) {
  onnx::ModelProto m = external_model("w.bin", nullptr, nullptr, {1});
  m.mutable_graph()->mutable_initializer(0)->set_data_type(onnx::TensorProto::STRING);
  expect_rejected(write_model(m), {"tensor 'w'", "string tensors cannot use external data"});
}

// ---------------------------------------------------------------- tensor dims, sizes, dtypes

TEST_F(Hostile, DimsOverflowInt64) {
  int64_t big = int64_t{1} << 40;
  expect_rejected(write_model(model_with_w(onnx::TensorProto::FLOAT, {big, big})),
                  {"tensor 'w'", "element count overflows int64 at dim 1"});
}

TEST_F(Hostile, NegativeDim) {
  expect_rejected(write_model(model_with_w(onnx::TensorProto::FLOAT, {-1})),
                  {"tensor 'w'", "dim 0 is negative (-1)"});
}

TEST_F(Hostile, NegativeDimInInputType) {
  onnx::ModelProto m = add_model();
  m.mutable_graph()
      ->mutable_input(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_value(-3);
  expect_rejected(write_model(m), {"input 'x'", "dim 0 is negative (-3)"});
}

TEST_F(Hostile, TensorAboveDefaultSizeCap) {
  expect_rejected(write_model(model_with_w(onnx::TensorProto::FLOAT, {int64_t{1} << 32})),
                  {"tensor 'w'", "exceed the tensor size cap of 4294967296 bytes"});
}

TEST_F(Hostile, TensorAboveSizeCapFromOptions) {
  onnx::ModelProto m = model_with_w(onnx::TensorProto::FLOAT, {512});
  m.mutable_graph()->mutable_initializer(0)->set_raw_data(std::string(2048, '\0'));
  graph::LoadOptions o;
  o.max_tensor_bytes = 1024;
  expect_rejected(write_model(m), {"tensor 'w'", "exceed the tensor size cap of 1024 bytes"}, o,
                  false);
}

// 2 GiB (under the cap) declared, nothing stored: refused before allocating.
TEST_F(Hostile, HugeDimsWithoutDataAllocatesNothing) {
  expect_rejected(write_model(model_with_w(onnx::TensorProto::FLOAT, {int64_t{1} << 29})),
                  {"tensor 'w'", "holds 0 values but dims need 536870912"});
}

// String tensors have no byte size, so the cap does not apply; the count check must come first.
TEST_F(Hostile, HugeStringTensorAllocatesNothing) {
  expect_rejected(write_model(model_with_w(onnx::TensorProto::STRING, {int64_t{1} << 40})),
                  {"tensor 'w'", "string_data holds 0 values but dims need 1099511627776"});
}

TEST_F(Hostile, RankAboveLimit) {
  expect_rejected(write_model(model_with_w(onnx::TensorProto::FLOAT, std::vector<int64_t>(65, 1))),
                  {"tensor 'w'", "rank 65 exceeds 64"});
}

TEST_F(Hostile, UnknownDtypeInInitializer) {
  expect_rejected(write_model(model_with_w(99, {4})), {"tensor 'w'", "unknown data type 99"});
}

TEST_F(Hostile, UnknownElemTypeInInput) {
  onnx::ModelProto m = add_model();
  m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(99);
  expect_rejected(write_model(m), {"input 'x'", "unknown data type 99"});
}

TEST_F(Hostile, RawDataSizeMismatch) {
  onnx::ModelProto m = model_with_w(onnx::TensorProto::FLOAT, {1});
  m.mutable_graph()->mutable_initializer(0)->set_raw_data("abc");
  expect_rejected(write_model(m), {"tensor 'w'", "raw_data has 3 bytes but dims need 4"});
}

TEST_F(Hostile, FloatDataTooFewValues) {
  onnx::ModelProto m = model_with_w(onnx::TensorProto::FLOAT, {4});
  for (float f : {1.f, 2.f, 3.f}) m.mutable_graph()->mutable_initializer(0)->add_float_data(f);
  expect_rejected(write_model(m), {"tensor 'w'", "holds 3 values but dims need 4"});
}

TEST_F(Hostile, FloatDataTooManyValues) {
  onnx::ModelProto m = model_with_w(onnx::TensorProto::FLOAT, {2});
  for (float f : {1.f, 2.f, 3.f}) m.mutable_graph()->mutable_initializer(0)->add_float_data(f);
  expect_rejected(write_model(m), {"tensor 'w'", "float_data holds 3 values but dims need 2"});
}

TEST_F(Hostile, AttributeTensorRawDataMismatch) {
  onnx::ModelProto m = add_model();
  auto* c = add_node(m.mutable_graph(), "Constant", {}, {"k"}, "c");
  auto* a = c->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  a->mutable_t()->add_dims(1);
  a->mutable_t()->set_raw_data("abc");
  expect_rejected(write_model(m), {"node 'c' (Constant)", "attribute 'value'", "raw_data has 3"});
}

// An attribute whose type is outside the enum arrives as UNDEFINED (proto2 keeps the 99 as an
// unknown field); with no value set there is nothing to infer the type from.
TEST_F(Hostile, AttributeWithUnknownTypeAndNoValue) {
  onnx::ModelProto m = add_model();
  auto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
  a->set_name("mystery");
  a->GetReflection()->MutableUnknownFields(a)->AddVarint(20, 99);
  expect_rejected(write_model(m),
                  {"node 'add' (Add)", "attribute 'mystery'", "no type and no value"});
}

}  // namespace
}  // namespace onnxtrain::hostile
