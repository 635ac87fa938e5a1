// LR schedules: values at chosen steps for constant / step / cosine / warmup, and the spec
// parser's results and errors.
#include "runtime/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "graph/error.h"

namespace onnxtrain::runtime {
namespace {

TEST(LrSchedule, Constant) {
  const LrSchedule s = parse_lr_schedule("constant", 0.01f);
  EXPECT_EQ(s.kind, LrSchedule::Kind::kConstant);
  for (int64_t step : {0, 1, 1000, 1000000}) EXPECT_FLOAT_EQ(lr_at(s, step), 0.01f);
}

TEST(LrSchedule, StepDecay) {
  const LrSchedule s = parse_lr_schedule("step:30:0.1", 1.0f);
  EXPECT_EQ(s.kind, LrSchedule::Kind::kStep);
  EXPECT_EQ(s.step_size, 30);
  EXPECT_FLOAT_EQ(lr_at(s, 0), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(s, 29), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(s, 30), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(s, 59), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(s, 60), 0.01f);
  EXPECT_FLOAT_EQ(lr_at(s, 95), 0.001f);
  // Default gamma 0.1.
  EXPECT_FLOAT_EQ(lr_at(parse_lr_schedule("step:10", 2.0f), 25), 0.02f);
  EXPECT_FLOAT_EQ(lr_at(parse_lr_schedule("step:2:0.5", 8.0f), 5), 2.0f);
}

TEST(LrSchedule, Cosine) {
  LrSchedule s = parse_lr_schedule("cosine", 0.1f);
  EXPECT_EQ(s.kind, LrSchedule::Kind::kCosine);
  EXPECT_EQ(s.total_steps, 0);
  EXPECT_THROW(lr_at(s, 0), Error);  // total not known yet
  s.total_steps = 100;
  EXPECT_FLOAT_EQ(lr_at(s, 0), 0.1f);
  EXPECT_NEAR(lr_at(s, 50), 0.05, 1e-7);
  EXPECT_NEAR(lr_at(s, 25), 0.05 * (1 + std::cos(std::numbers::pi / 4)), 1e-7);
  EXPECT_NEAR(lr_at(s, 100), 0.0, 1e-9);
  EXPECT_NEAR(lr_at(s, 500), 0.0, 1e-9);  // clamped past the end

  const LrSchedule m = parse_lr_schedule("cosine:200:0.001", 0.1f);
  EXPECT_EQ(m.total_steps, 200);
  EXPECT_FLOAT_EQ(m.min_lr, 0.001f);
  EXPECT_NEAR(lr_at(m, 100), 0.001 + 0.099 * 0.5, 1e-7);
  EXPECT_NEAR(lr_at(m, 200), 0.001, 1e-8);
}

TEST(LrSchedule, WarmupThenCosine) {
  LrSchedule s = parse_lr_schedule("warmup:500,cosine", 0.2f);
  EXPECT_EQ(s.warmup_steps, 500);
  EXPECT_EQ(s.kind, LrSchedule::Kind::kCosine);
  s.total_steps = 1500;
  EXPECT_NEAR(lr_at(s, 0), 0.2 / 500, 1e-9);
  EXPECT_NEAR(lr_at(s, 249), 0.1, 1e-7);
  EXPECT_NEAR(lr_at(s, 499), 0.2, 1e-7);
  EXPECT_NEAR(lr_at(s, 500), 0.2, 1e-7);   // cosine starts at its own step 0
  EXPECT_NEAR(lr_at(s, 1000), 0.1, 1e-7);  // halfway through the 1000 cosine steps
  EXPECT_NEAR(lr_at(s, 1500), 0.0, 1e-9);
}

TEST(LrSchedule, WarmupAloneAndWithStep) {
  const LrSchedule w = parse_lr_schedule("warmup:4", 1.0f);
  EXPECT_EQ(w.kind, LrSchedule::Kind::kConstant);
  EXPECT_FLOAT_EQ(lr_at(w, 0), 0.25f);
  EXPECT_FLOAT_EQ(lr_at(w, 2), 0.75f);
  EXPECT_FLOAT_EQ(lr_at(w, 3), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(w, 100), 1.0f);
  const LrSchedule s = parse_lr_schedule("warmup:10,step:5:0.5", 1.0f);
  EXPECT_FLOAT_EQ(lr_at(s, 9), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(s, 14), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(s, 15), 0.5f);
}

TEST(LrSchedule, NegativeStepFails) {
  EXPECT_THROW(lr_at(parse_lr_schedule("constant", 0.1f), -1), Error);
}

TEST(LrSchedule, BadSpecs) {
  for (const char* spec : {"",
                           "linear",
                           "constant:3",
                           "step",
                           "step:0",
                           "step:-3",
                           "step:x",
                           "step:10:0",
                           "step:10:-1",
                           "step:10:0.1:4",
                           "step:1e3",
                           "cosine:abc",
                           "cosine:10:1",
                           "cosine:10:-0.1",
                           "cosine:1:2:3",
                           "warmup",
                           "warmup:0",
                           "warmup:5:6",
                           "cosine,warmup:5",
                           "warmup:5,",
                           "warmup:5,constant,cosine",
                           "constant,cosine",
                           "warmup:10,cosine:10",
                           " constant",
                           "step:10:nan"}) {
    try {
      parse_lr_schedule(spec, 0.1f);
      ADD_FAILURE() << "accepted bad spec '" << spec << "'";
    } catch (const Error& e) {
      // The message quotes the whole spec so the CLI error says what was given.
      EXPECT_NE(std::string(e.what()).find(std::string("'") + spec + "'"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(parse_lr_schedule("constant", 0.0f), Error);
  EXPECT_THROW(parse_lr_schedule("constant", -1.0f), Error);
}

}  // namespace
}  // namespace onnxtrain::runtime
