// Trains a zoo model with tools::Trainer (one replica) and reports step time, images/s and test
// accuracy per epoch: the tool for choosing the README's demo configuration and for timing
// training steps against PyTorch (bench/resnet_train_cpu.sh). Not part of ctest.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/tensor.h"
#include "models/zoo.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/data/transform.h"
#include "runtime/lr_schedule.h"
#include "runtime/device/device.h"
#include "runtime/session.h"
#include "tools/train_api.h"

namespace onnxtrain {
namespace {

struct Config {
  std::string model = "resnet18";
  std::vector<int64_t> input = {1, 28, 28};
  int64_t width = 16, classes = 10, batch = 64;
  int threads = 1, epochs = 1;
  int64_t steps = 0;     // > 0: stop after this many timed steps (no evaluation)
  int64_t warmup = 2;    // untimed steps before the timed ones when `steps` > 0
  int64_t train_limit = 0;  // > 0: train on the first N examples only
  float lr = 1e-3f, weight_decay = 0;
  std::string schedule = "constant";  // runtime::parse_lr_schedule spec
  std::string optimizer = "adam";     // adam | sgd | momentum | adamw
  std::string data = "fashion-mnist";
  std::string profile;  // Chrome trace of the timed steps
  uint64_t seed = 1;
  std::string device = "cpu";  // cpu | cuda[:N] | sim
  bool tf32 = true;
};

const char* kUsage =
    "usage: demo_config [--model resnet18] [--input 1x28x28] [--width 16] [--classes 10]\n"
    "  [--batch 64] [--threads 1] [--epochs 1] [--lr 1e-3] [--schedule constant|cosine|...]\n"
    "  [--optimizer adam|adamw|sgd|momentum] [--weight-decay 0] [--data fashion-mnist|synthetic:N]\n"
    "  [--train-limit N] [--steps N [--warmup K]] [--profile trace.json] [--seed S]\n"
    "  [--device cpu|cuda[:N]] [--no-tf32]\n";

std::vector<int64_t> parse_dims(const std::string& s) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t x = s.find('x', pos);
    if (x == std::string::npos) x = s.size();
    out.push_back(std::stoll(s.substr(pos, x - pos)));
    pos = x + 1;
  }
  return out;
}

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (a == "--no-tf32") {
      c.tf32 = false;
      continue;
    }
    OT_CHECK(i + 1 < argc, "demo_config: ", a, " needs a value");
    std::string v = argv[++i];
    if (a == "--model") c.model = v;
    else if (a == "--input") c.input = parse_dims(v);
    else if (a == "--width") c.width = std::stoll(v);
    else if (a == "--classes") c.classes = std::stoll(v);
    else if (a == "--batch") c.batch = std::stoll(v);
    else if (a == "--threads") c.threads = std::stoi(v);
    else if (a == "--device") c.device = v;
    else if (a == "--epochs") c.epochs = std::stoi(v);
    else if (a == "--steps") c.steps = std::stoll(v);
    else if (a == "--warmup") c.warmup = std::stoll(v);
    else if (a == "--train-limit") c.train_limit = std::stoll(v);
    else if (a == "--lr") c.lr = std::stof(v);
    else if (a == "--weight-decay") c.weight_decay = std::stof(v);
    else if (a == "--schedule") c.schedule = v;
    else if (a == "--optimizer") c.optimizer = v;
    else if (a == "--data") c.data = v;
    else if (a == "--profile") c.profile = v;
    else if (a == "--seed") c.seed = std::stoull(v);
    else fail("demo_config: unknown option '", a, "'\n", kUsage);
  }
  return c;
}

passes::OptimizerKind optimizer_kind(const std::string& s) {
  if (s == "adam") return passes::OptimizerKind::kAdam;
  if (s == "adamw") return passes::OptimizerKind::kAdamW;
  if (s == "sgd") return passes::OptimizerKind::kSgd;
  if (s == "momentum") return passes::OptimizerKind::kMomentum;
  fail("demo_config: --optimizer '", s, "' (expected adam, adamw, sgd or momentum)");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU seconds of the whole process (all threads): on a machine shared with other work, CPU
// time per step is what the step costs, wall time also counts the slices others took.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

runtime::LoaderOptions eval_options() {
  runtime::LoaderOptions o;
  o.batch_size = 500;
  o.shuffle = false;
  return o;
}

// Top-1 accuracy of `model` (inference graph, BN in eval mode) on every example of `data`.
double evaluate(std::unique_ptr<graph::Model> model, const runtime::Dataset& data,
                const std::vector<int64_t>& input, int threads) {
  runtime::SessionOptions opts;
  opts.threads = threads;
  runtime::InferenceSession session(std::move(model), opts);
  runtime::DataLoader loader(data, runtime::InputAdapter::for_dataset(data, input),
                             eval_options());
  int64_t correct = 0;
  for (int64_t s = 0; s < loader.steps_per_epoch(); ++s) {
    runtime::Batch b = loader.next();
    std::vector<graph::Tensor> out = session.run({{"input", b.inputs}});
    const float* logits = out[0].data_as<float>();
    const int64_t classes = out[0].dims()[1];
    const int64_t* labels = b.targets.data_as<int64_t>();
    for (int64_t i = 0; i < b.size(); ++i) {
      const float* row = logits + i * classes;
      correct += (std::max_element(row, row + classes) - row) == labels[i];
    }
  }
  return static_cast<double>(correct) / static_cast<double>(data.size());
}

int run(const Config& c) {
  models::ZooOptions zo;
  zo.input_shape = c.input;
  zo.classes = c.classes;
  zo.width = c.model == "linear" ? 0 : c.width;
  zo.seed = c.seed;
  tools::TrainerOptions to;
  to.graph.optimizer.kind = optimizer_kind(c.optimizer);
  to.graph.optimizer.weight_decay = c.weight_decay;
  to.session.threads = c.threads;
  to.session.profile_path = c.profile;
  to.session.device = runtime::make_device(c.device);
  runtime::set_cuda_tf32(c.tf32);
  tools::Trainer trainer(models::build_zoo_model(c.model, zo), to);

  runtime::DataConfig dc;
  dc.train_spec = c.data;
  dc.seed = c.seed;
  runtime::LoadOptions lo;
  lo.model_input = c.input;
  lo.num_classes = c.classes;
  lo.seed = c.seed;
  runtime::TrainValData data = runtime::load_train_val(dc, lo);
  runtime::Dataset train = data.train;
  if (c.train_limit > 0 && c.train_limit < train.size()) {
    std::vector<int64_t> idx(static_cast<size_t>(c.train_limit));
    for (int64_t i = 0; i < c.train_limit; ++i) idx[static_cast<size_t>(i)] = i;
    train = train.subset(idx, train.name() + " (first " + std::to_string(c.train_limit) + ")");
  }
  runtime::LoaderOptions train_opts;
  train_opts.batch_size = c.batch;
  train_opts.seed = c.seed;
  runtime::DataLoader loader(train, runtime::InputAdapter::for_dataset(train, c.input), train_opts);
  runtime::LrSchedule sched = runtime::parse_lr_schedule(c.schedule, c.lr);
  const int64_t per_epoch = loader.steps_per_epoch();
  if (sched.kind == runtime::LrSchedule::Kind::kCosine && sched.total_steps == 0)
    sched.total_steps = per_epoch * c.epochs;
  std::printf("demo_config: %s input %s width %lld, %s lr %g schedule %s, batch %lld, threads %d, "
              "%lld train examples (%lld steps/epoch)\n",
              c.model.c_str(), models::format_dims(c.input).c_str(),
              static_cast<long long>(c.width), c.optimizer.c_str(), static_cast<double>(c.lr),
              c.schedule.c_str(), static_cast<long long>(c.batch), c.threads,
              static_cast<long long>(train.size()), static_cast<long long>(per_epoch));
  std::fflush(stdout);

  int64_t global_step = 0;
  auto one_step = [&](runtime::StepResult& r, int64_t& n) {
    runtime::Batch b = loader.next();
    n = b.size();
    r = trainer.step({{"input", b.inputs}, {"labels", b.targets}}, runtime::lr_at(sched, global_step));
    ++global_step;
  };

  if (c.steps > 0) {  // timing only
    runtime::StepResult r;
    int64_t n = 0;
    for (int64_t s = 0; s < c.warmup; ++s) one_step(r, n);
    std::vector<double> ms, cpu_ms;
    for (int64_t s = 0; s < c.steps; ++s) {
      auto t0 = std::chrono::steady_clock::now();
      const double c0 = cpu_seconds();
      one_step(r, n);
      cpu_ms.push_back((cpu_seconds() - c0) * 1e3);
      ms.push_back(seconds_since(t0) * 1e3);
    }
    const double med = median(ms);
    std::printf("steps %lld (after %lld warm-up): median %.1f ms/step, %.1f images/s, median CPU "
                "%.1f ms/step (all threads), last loss %.4f\n",
                static_cast<long long>(c.steps), static_cast<long long>(c.warmup), med,
                static_cast<double>(c.batch) * 1e3 / med, median(cpu_ms), r.loss);
    return 0;
  }

  double train_seconds = 0;
  for (int e = 0; e < c.epochs; ++e) {
    std::vector<double> ms;
    double loss = 0, correct = 0;
    int64_t seen = 0;
    auto t_epoch = std::chrono::steady_clock::now();
    const double cpu_epoch = cpu_seconds();
    for (int64_t s = 0; s < per_epoch; ++s) {
      auto t0 = std::chrono::steady_clock::now();
      runtime::StepResult r;
      int64_t n = 0;
      one_step(r, n);
      ms.push_back(seconds_since(t0) * 1e3);
      loss += r.loss * static_cast<double>(n);
      correct += r.correct;
      seen += n;
    }
    const double epoch_s = seconds_since(t_epoch);
    const double epoch_cpu_s = cpu_seconds() - cpu_epoch;
    train_seconds += epoch_s;
    double test_acc = std::nan("");
    if (data.val) test_acc = evaluate(trainer.trained_model(), *data.val, c.input, c.threads);
    std::printf("epoch %d: %.1f s (CPU %.1f s), median %.1f ms/step, %.0f images/s, train loss "
                "%.4f acc %.2f%%, test acc %.2f%%, training so far %.1f s\n",
                e + 1, epoch_s, epoch_cpu_s, median(ms), static_cast<double>(seen) / epoch_s,
                loss / static_cast<double>(seen), 100.0 * correct / static_cast<double>(seen),
                100.0 * test_acc, train_seconds);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace onnxtrain

int main(int argc, char** argv) {
  try {
    return onnxtrain::run(onnxtrain::parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "demo_config: error: " << e.what() << "\n";
    return 1;
  }
}
