// The small ResNet the training-pass tests build and train (fuse_batchnorm_relu,
// schedule_updates, keep_weight_copies): resnet18 at 20x20, 5 classes, width 8, batches of 6.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "graph/tensor.h"
#include "models/zoo.h"
#include "runtime/training_session.h"

namespace onnxtrain::passtest {

inline std::unique_ptr<graph::Model> small_resnet() {
  return models::build_zoo_model("resnet18",
                                 {.input_shape = {3, 20, 20}, .classes = 5, .width = 8, .seed = 3});
}

// Six random images and labels.
inline std::map<std::string, graph::Tensor> small_resnet_batch(std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int64_t> label(0, 4);
  std::vector<float> x(6 * 3 * 20 * 20);
  for (float& v : x) v = normal(rng);
  std::vector<int64_t> y(6);
  for (int64_t& v : y) v = label(rng);
  return {{"input", graph::Tensor::from_vector(graph::DataType::kFloat, {6, 3, 20, 20}, x)},
          {"labels", graph::Tensor::from_vector(graph::DataType::kInt64, {6}, y)}};
}

// `steps` training steps of a and b on the same batches: equal losses and bit-equal state
// after each (b may hold more state than a: a's is compared).
inline void expect_same_steps(runtime::TrainingSession& a, runtime::TrainingSession& b, int steps,
                              uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int s = 0; s < steps; ++s) {
    const std::map<std::string, graph::Tensor> feeds = small_resnet_batch(rng);
    const runtime::StepResult ra = a.step(feeds, 1e-2f, 1.0f / 6);
    const runtime::StepResult rb = b.step(feeds, 1e-2f, 1.0f / 6);
    EXPECT_EQ(ra.loss, rb.loss) << "step " << s;
    for (const std::string& name : a.state_names())
      ASSERT_TRUE(a.state(name).equals(b.state(name))) << name << " after step " << s;
  }
}

}  // namespace onnxtrain::passtest
