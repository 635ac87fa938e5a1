// Trainer (train_api.h): the C++ API's options mapped onto train::Options with one replica.
#include "tools/train_api.h"

namespace onnxtrain::tools {
namespace {

train::Options trainer_options(const TrainerOptions& o) {
  train::Options t;
  t.model.trainable = o.graph.trainable;
  t.model.output = o.graph.output;
  t.model.loss = o.graph.loss;
  t.optimizer = o.graph.optimizer;
  t.parallel.replicas = 1;
  t.parallel.device = o.session.device ? o.session.device->name() : "cpu";
  t.parallel.threads = o.session.threads > 0 ? o.session.threads : train::default_threads(1);
  t.parallel.profile = o.session.profile_path;
  return t;
}

}  // namespace

Trainer::Trainer(const std::string& model_path, const TrainerOptions& opts) {
  train::Options t = trainer_options(opts);
  t.model.path = model_path;
  trainer_ = std::make_unique<train::Trainer>(t);
  trainer_->start();
}

Trainer::Trainer(std::unique_ptr<graph::Model> model, const TrainerOptions& opts)
    : trainer_(std::make_unique<train::Trainer>(std::move(model), trainer_options(opts))) {}

}  // namespace onnxtrain::tools
