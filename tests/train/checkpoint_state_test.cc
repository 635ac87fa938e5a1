// The checkpoint state's serializer (train/checkpoint_state.h): a state survives the metadata
// round trip bit for bit, and another version, an unknown enum name, a missing field or a bad
// number is a one-line error naming the file and the field.
#include "train/checkpoint_state.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <string>

#include "graph/error.h"

namespace onnxtrain::train {
namespace {

CheckpointState sample_state() {
  CheckpointState s;
  RunIdentity& id = s.identity;
  id.model_hash = "0123456789abcdef";
  id.optimizer = passes::OptimizerKind::kAdamW;
  id.momentum = 0.9f;
  id.nesterov = true;
  id.weight_decay = 1e-4f;
  id.clip_norm = 1.5f;
  id.lr = 0.01f;
  id.schedule_kind = runtime::LrSchedule::Kind::kCosine;
  id.schedule = "warmup:10,cosine";
  id.global_batch = 96;
  id.replicas = 2;
  id.processes = 3;
  id.seed = std::numeric_limits<uint64_t>::max();
  id.data = "synthetic:200";
  id.val_split = 0.1;
  id.normalization = "mean=0.5, std=0.25,";
  id.loss = passes::LossKind::kCrossEntropy;
  id.output_name = "logits";
  id.freeze = "^conv1";
  id.trainable = "";
  id.sync_batchnorm = true;
  id.reduce_precision = graph::DataType::kBFloat16;
  RunPosition& p = s.position;
  p.step = 17;
  p.steps_per_epoch = 7;
  // Sums that only survive as exact text (0.1 + 0.2 is not 0.3).
  p.epoch_loss_sum = 0.1 + 0.2;
  p.epoch_correct = 5.0 / 3.0;
  p.epoch_seconds = 1e-300;
  p.epoch_examples = 96;
  p.epoch_steps = 3;
  return s;
}

// The message of the Error that from_metadata throws; "" when it does not throw.
std::string read_error(const std::map<std::string, std::string>& m) {
  try {
    from_metadata(m, "run/ckpt-17.otck");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CheckpointState, RoundTripIsExact) {
  const CheckpointState s = sample_state();
  const std::map<std::string, std::string> m = to_metadata(s);
  EXPECT_EQ(m.at("format"), kCheckpointFormat);
  const CheckpointState back = from_metadata(m, "ckpt.otck");
  EXPECT_EQ(back, s);
  EXPECT_EQ(back.position.epoch_loss_sum, 0.1 + 0.2);
  EXPECT_EQ(back.identity.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(to_metadata(back), m);
}

TEST(CheckpointState, EnumsAreWrittenByName) {
  const std::map<std::string, std::string> m = to_metadata(sample_state());
  EXPECT_EQ(m.at("opt.optimizer"), "adamw");
  EXPECT_EQ(m.at("opt.loss"), "cross-entropy");
  EXPECT_EQ(m.at("opt.lr_schedule_kind"), "cosine");
  EXPECT_EQ(m.at("opt.lr"), "0.01");
  EXPECT_EQ(m.at("opt.reduce_precision"), "bf16");
  for (passes::OptimizerKind k :
       {passes::OptimizerKind::kSgd, passes::OptimizerKind::kMomentum, passes::OptimizerKind::kAdam,
        passes::OptimizerKind::kAdamW, passes::OptimizerKind::kAdagrad})
    EXPECT_EQ(optimizer_kind_from_name(optimizer_kind_name(k)), k);
  for (passes::LossKind k :
       {passes::LossKind::kAuto, passes::LossKind::kCrossEntropy, passes::LossKind::kMse})
    EXPECT_EQ(loss_kind_from_name(loss_kind_name(k)), k);
  EXPECT_FALSE(optimizer_kind_from_name("Adam").has_value());
}

TEST(CheckpointState, UnknownEnumNameNamesFileAndField) {
  std::map<std::string, std::string> m = to_metadata(sample_state());
  m["opt.optimizer"] = "lamb";
  EXPECT_EQ(read_error(m),
            "run/ckpt-17.otck: checkpoint field 'opt.optimizer': unknown optimizer 'lamb' "
            "(expected sgd, momentum, adam, adamw or adagrad)");
  m = to_metadata(sample_state());
  m["opt.loss"] = "1";  // the integer a version 1 checkpoint would have held
  EXPECT_EQ(read_error(m),
            "run/ckpt-17.otck: checkpoint field 'opt.loss': unknown loss '1' (expected auto, "
            "cross-entropy, mse or output)");
  m = to_metadata(sample_state());
  m["opt.lr_schedule_kind"] = "linear";
  EXPECT_NE(read_error(m).find("field 'opt.lr_schedule_kind': unknown learning-rate schedule "
                               "'linear'"),
            std::string::npos);
}

TEST(CheckpointState, OtherVersionsAreRefused) {
  std::map<std::string, std::string> m = to_metadata(sample_state());
  m["format"] = "onnxtrain-checkpoint/1";
  EXPECT_EQ(read_error(m),
            "run/ckpt-17.otck: checkpoint field 'format' is 'onnxtrain-checkpoint/1', this "
            "onnxtrain reads 'onnxtrain-checkpoint/2' only (start again with a new "
            "--checkpoint-dir)");
  m["format"] = "onnxtrain-checkpoint/3";
  EXPECT_NE(read_error(m).find("'onnxtrain-checkpoint/3'"), std::string::npos);
  m.erase("format");
  EXPECT_NE(read_error(m).find("run/ckpt-17.otck: not an onnxtrain training checkpoint"),
            std::string::npos);
}

TEST(CheckpointState, MissingFieldsAndBadNumbersNameTheField) {
  std::map<std::string, std::string> m = to_metadata(sample_state());
  m.erase("epoch_steps");
  EXPECT_EQ(read_error(m), "run/ckpt-17.otck: checkpoint field 'epoch_steps' is missing");
  m = to_metadata(sample_state());
  m["opt.lr"] = "0.01x";
  EXPECT_EQ(read_error(m), "run/ckpt-17.otck: checkpoint field 'opt.lr' is not a number: '0.01x'");
  m = to_metadata(sample_state());
  m["opt.nesterov"] = "1";
  EXPECT_NE(read_error(m).find("field 'opt.nesterov' is not true or false"), std::string::npos);
  m = to_metadata(sample_state());
  m["steps_per_epoch"] = "0";
  EXPECT_NE(read_error(m).find("out of range"), std::string::npos);
}

// Dynamic loss scaling (--precision fp16): the scale and its clean steps round-trip; a run
// without loss scaling writes neither field; a scale that is not a positive number is named.
TEST(CheckpointState, LossScaleRoundTripsAndIsRangeChecked) {
  EXPECT_EQ(to_metadata(sample_state()).count("loss_scale"), 0u);
  CheckpointState s = sample_state();
  s.position.loss_scale = 32768;
  s.position.loss_scale_clean_steps = 1999;
  std::map<std::string, std::string> m = to_metadata(s);
  EXPECT_EQ(m.at("loss_scale"), "32768");
  const CheckpointState back = from_metadata(m, "ckpt.otck");
  EXPECT_EQ(back, s);
  m["loss_scale"] = "-4";
  EXPECT_NE(read_error(m).find("run/ckpt-17.otck: checkpoint field 'loss_scale' (-4) or "
                               "'loss_scale_clean_steps' (1999) is out of range"),
            std::string::npos)
      << read_error(m);
  m = to_metadata(s);
  m.erase("loss_scale_clean_steps");
  EXPECT_EQ(read_error(m),
            "run/ckpt-17.otck: checkpoint field 'loss_scale_clean_steps' is missing");
}

TEST(CheckpointState, DifferenceListsChangedFields) {
  const RunIdentity a = sample_state().identity;
  RunIdentity b = a;
  EXPECT_EQ(identity_difference(a, b), "");
  b.lr = 0.02f;
  b.optimizer = passes::OptimizerKind::kSgd;
  EXPECT_EQ(identity_difference(a, b), "optimizer 'adamw' -> 'sgd', lr '0.01' -> '0.02'");
  b = a;
  b.reduce_precision = graph::DataType::kFloat;
  EXPECT_EQ(identity_difference(a, b), "reduce_precision 'bf16' -> 'fp32'");
}

}  // namespace
}  // namespace onnxtrain::train
