// onnxtrain's command line (train_args.h): the usage text and the parser, shared by the CLI
// (tools/onnxtrain.cc) and the Python module (python/), which hands it its keyword arguments.
#include "tools/train_args.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "graph/error.h"
#include "runtime/data/dataset.h"
#include "runtime/data/transform.h"
#include "runtime/lr_schedule.h"
#include "train/checkpoint_state.h"

namespace onnxtrain::tools {

const char* const kTrainUsage = R"(usage: onnxtrain MODEL.onnx [options]

Trains MODEL (an inference ONNX model) on CPUs or NVIDIA GPUs: builds the training graph (loss,
gradients, optimizer), runs it on R replicas that split each global batch and sum their
gradients, and writes the trained inference model. Prints the plan, then one line per epoch (a live progress
line when stdout is a terminal).

data:
  --data SPEC             fashion-mnist[:DIR] | mnist:DIR | npy:X.npy,Y.npy | images:DIR |
                          images:FILE.csv | synthetic:N | npz:FILE | npy:NAME=FILE,NAME=FILE,...
                          (default fashion-mnist; a bare FILE.npz or FILE.csv means npz:FILE
                          or images:FILE.csv). images:DIR = DIR/<class>/*.jpg|jpeg|png
                          (classes in sorted order); images:FILE.csv = lines path,INDEX (paths
                          relative to the CSV's folder, INDEX an integer class). Images are
                          decoded batch by batch (memory follows the prefetch depth, not the
                          dataset) for a model input (C,H,W). npz: and NAME=FILE feed each
                          array to the model input of its name, in the dtype the input
                          declares (token ids, masks, features); the array 'labels' holds
                          class labels, (N), per token (N,T) or per pixel (N,H,W), or float
                          targets (npy:X.npy,Y.npy too). synthetic:N fills integer inputs with
                          ids below the embedding table they index, masks with 1s
  --labels NAME           the array of npz:/NAME=FILE data holding the labels (default labels)
  --val-data SPEC         validation data ('none' = no validation; default: the dataset's
                          test split when it has one)
  --val-split F           hold out fraction F of the training data for validation
  --mean LIST --std LIST  normalization after scaling pixels to [0,1], e.g. 0.5 or
                          0.485,0.456,0.406 (default: the dataset's own)
  --seed N                shuffle order, synthetic data, holdout, augmentation (default 0)
  --augment MODE          image files, training only: none (default) | basic (random-resized-
                          crop to the input's HxW, scale [0.08,1], ratio [3/4,4/3], and a
                          horizontal flip p=0.5) | imagenet (basic + color jitter 0.4 for
                          brightness, contrast, saturation). Validation and none: shorter side
                          resized to round(side/0.875), then the center HxW crop (images already
                          HxW pass unchanged)
  --data-workers N        threads decoding image files (default: the cores the replicas'
                          threads leave free, at least 1)
  --on-bad-image MODE     an image file that does not decode: stop (default; an error naming
                          the file) | skip (warn, use the next readable image of the list for
                          that row; the count is reported per epoch)

length and batch:
  --epochs N              epochs (default 1)
  --steps N               optimizer steps instead of epochs (the last epoch may be partial)
  --batch-size N          examples per replica per step (default 64)
  --global-batch-size N   examples per step over all replicas (instead of --batch-size)

model and optimizer:
  --output-name NAME      the model output to train (default: the only/first float output)
  --loss KIND             auto (default) | cross-entropy | mse | output:NAME. auto: cross-
                          entropy for integer labels (or a (N,C,...) output), mse for float
                          targets. output:NAME trains a model that computes its own scalar
                          loss as output NAME (e.g. an export taking the labels as an input;
                          its arrays all feed inputs, none is taken as labels)
  --class-axis A          cross-entropy's class axis: 1 ((N, C, ...), torch's) or -1 (classes
                          last, (N, T, C) with per-token labels (N, T)); default: -1 when the
                          labels' shape fits only that (an LM head), else 1
  --ignore-index N        cross-entropy labels equal to N are padding: out of the loss, its
                          mean and the accuracy (torch's ignore_index; default: none)
  --bn-mode MODE          train (default, like model.train(): batch statistics, running
                          statistics updated) | frozen (like BN in eval(): the running
                          statistics normalize and stay as they are; scale/bias still train)
  --untie-initializers    give each node its own copy of a parameter an exporter merged
                          (equal initial values exported as one tensor; the plan warns)
  --precision P           fp32 (default) | bf16 | fp16: mixed precision, Conv/Gemm/MatMul and
                          their gradients in bfloat16/float16, float32 master weights,
                          optimizer, BN and loss. bf16 needs AVX512-BF16 or AMX; fp16 adds
                          dynamic loss scaling (an overflowed step is skipped and halves the
                          scale) and has no native CPU kernels here. The trained model and
                          validation stay float32
  --allow-emulation       run a --precision the CPU has no instructions for (slow)
  --conv-algorithm A      direct (default) | winograd: oneDNN's Winograd kernels for the 3x3
                          stride-1 float32 convolutions over maps of at least 7x7 (forward
                          and backward), 1.2-2.7x faster on AVX-512 CPUs at a ~5x larger
                          rounding error per conv (still ~1e-6 relative); the rest stay direct
  --plain-layout          keep every activation in plain NCHW; by default those passed between
                          CPU convolutions stay in oneDNN's blocked channel layout (nChw16c),
                          which saves a reorder around each convolution (for comparisons)
  --unfused               keep BatchNormalization, Relu, the residual Add and Sum and their
                          gradients as separate nodes; by default CPU training graphs compute
                          BN -> [Add ->] Relu and Sum -> ReluGrad in one pass each, with the
                          same bits (for comparisons)
  --no-weight-copies      bf16: the convolutions round the float32 master weights to bf16
                          themselves at every read and write float32 weight gradients, and the
                          optimizer reads float32 casts of bf16 gradients. By default the
                          convolutions read bf16 copies that the optimizer rewrites after each
                          update (the same bits), and with one replica the optimizer reads bf16
                          gradients itself: the convolutions' dW then rounded to bf16, as
                          torch.autocast's (for comparisons)
  --loss-scale S          fp16: the initial loss scale, a power of two (default 65536)
  --loss-scale-growth-interval N
                          fp16: double the scale after N overflow-free steps (default 2000)
  --freeze REGEX          do not train parameters whose name matches
  --trainable REGEX       train only parameters whose name matches
  --optimizer KIND        sgd | momentum | adam (default) | adamw | adagrad
  --lr F                  learning rate (default 1e-4)
  --momentum F            momentum (default 0.9 for 'momentum'; with 'sgd' it makes it momentum)
  --weight-decay F        L2 penalty (decoupled for adamw; default 0)
  --lr-schedule SPEC      constant (default) | step:SIZE[:GAMMA] | cosine[:TOTAL[:MIN_LR]],
                          optionally after warmup:N, e.g. warmup:100,cosine (counts in steps)
  --clip-norm F           clip the gradients' global L2 norm to F

replicas and threads:
  --replicas N            data-parallel replicas (default 1): cpu:0..N-1, or GPUs 0..N-1
  --device D              cpu | cuda (replica k on GPU k) | cuda:N (one replica on GPU N)
                          (default: cuda when an NVIDIA GPU is present, else cpu)
  --no-tf32               full float32 matmul/conv on GPUs (default: TF32 where supported)
  --threads N             total intra-op threads, split across replicas (default: all cores)
  --oversubscribe         allow more than 8 replicas or threads per CPU (refused otherwise)
  --bucket-mb F           gradient bucket size for AllReduce (default 25)
  --reduce-precision P    fp32 (default) | bf16: AllReduce the gradients in bfloat16, half the
                          bytes between processes and GPUs (each gradient rounded to bf16, the
                          sum rounded again; the optimizer still updates float32)
  --sync-batchnorm        training BatchNormalization uses the global batch's statistics
                          (all replicas'); with --replicas 1 it changes nothing
  --no-shard-updates      every replica runs every optimizer update (default with 2+ CPU
                          replicas in one process: each parameter's update runs on one
                          replica, which then copies the new weight to the others; the same
                          weights, 1/R of the update work and optimizer state per replica)

several processes (mpirun -np P onnxtrain ... trains P x R replicas; see README):
  --collective-timeout S  a process waiting longer than S seconds for another in a collective
                          ends the job with an error naming both (default 300)
  --verify-ranks          after every step, check that every process holds the same weights
                          (a hash of them compared across ranks; one pass over the weights per
                          step). Without it they are compared once, after training

files:
  --output FILE           the trained inference model (written atomically; never the input)
  --save-graph FILE       the training graph as ONNX, written before training (see onnxdump)
  --custom-op-lib PATH    load a custom-op library (docs/ADDING_OPS.md) before the model is
                          read; repeatable
  --checkpoint-dir DIR    write DIR/ckpt-<step>.otck (the last 3 are kept)
  --checkpoint-every N    every N steps (default: at the end of every epoch)
  --resume                continue from the newest checkpoint in --checkpoint-dir
  --overwrite-checkpoints start a fresh run in a --checkpoint-dir that holds another run's
                          checkpoints (refused otherwise; they are never pruned)
  --on-nonfinite MODE     a step whose loss is NaN/Inf: stop (default: exit 1 naming the step
                          and the first non-finite value; nothing is written after it) | skip
                          (its update is dropped, as torch's GradScaler does; keeps a copy of
                          the state from before every step)
  --max-nonfinite-skips N with skip: stop after N such steps in a row (default 10)
  --metrics-json FILE     append one JSON object per epoch
  --tensorboard DIR       write TensorBoard event files (tensorboard --logdir DIR): DIR/train
                          and DIR/validation, epoch_loss/epoch_accuracy/... per epoch as Keras
                          writes them, batch_loss/batch_accuracy/batch_learning_rate by step
  --tensorboard-every N   batch scalars every N steps (default 10; 0: per epoch only)
  --profile FILE          Chrome trace of the executed kernels (FILE.r<k> per replica)

  -h, --help              this text
  --version               print the version

exit status: 0 success, 1 the model, data, checkpoint or a file could not be used (one
             line on stderr), 2 usage error (unknown option, missing or bad value, a
             malformed --data/--val-data/--lr-schedule spec, conflicting options)
)";

namespace {

template <typename... Args>
[[noreturn]] void usage_fail(Args&&... args) {
  throw UsageError(cat(std::forward<Args>(args)..., " (see onnxtrain --help)"));
}

int64_t parse_int(std::string_view flag, std::string_view text, int64_t min) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < min)
    usage_fail(flag, ": expected an integer >= ", min, ", got '", text, "'");
  return v;
}

double parse_float(std::string_view flag, const std::string& text, double min,
                   bool min_inclusive = true) {
  char* end = nullptr;
  errno = 0;
  const double v = text.empty() ? 0 : std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || end != text.c_str() + text.size() || !std::isfinite(v) ||
      v < min || (!min_inclusive && v == min))
    usage_fail(flag, ": expected a number ", min_inclusive ? ">= " : "> ", min, ", got '", text,
               "'");
  return v;
}


passes::OptimizerKind optimizer_kind(const std::string& s) {
  std::optional<passes::OptimizerKind> k = train::optimizer_kind_from_name(s);
  if (!k)
    usage_fail("--optimizer: unknown '", s, "' (expected ", train::optimizer_kind_names(), ")");
  return *k;
}

passes::LossKind loss_kind(const std::string& s) {
  std::optional<passes::LossKind> k = train::loss_kind_from_name(s);
  if (!k) usage_fail("--loss: unknown '", s, "' (expected ", train::loss_kind_names(), ")");
  return *k;
}

}  // namespace

Args parse_train_args(int argc, const char* const* argv) {
  Args a;
  TrainConfig& c = a.config;
  bool only_positional = false;
  std::string loss_output;  // --loss output:NAME
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::optional<std::string> inline_value;
    if (!only_positional && arg.starts_with("--") && arg.find('=') != std::string::npos) {
      inline_value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) usage_fail(arg, " needs a value");
      return argv[++i];
    };
    auto path = [&]() -> std::string {
      std::string v = value();
      if (v.empty()) usage_fail(arg, ": empty file name");
      return v;
    };
    auto no_value = [&] {
      if (inline_value) usage_fail(arg, " takes no value");
    };
    if (only_positional || arg.empty() || arg[0] != '-' || arg == "-") {
      if (!c.train.model.path.empty())
        usage_fail("unexpected argument '", arg, "' (the model is already '", c.train.model.path,
                   "')");
      if (arg.empty()) usage_fail("empty model path");
      c.train.model.path = arg;
    } else if (arg == "--") {
      only_positional = true;
    } else if (arg == "-h" || arg == "--help") {
      no_value();
      a.help = true;
    } else if (arg == "--version") {
      no_value();
      a.version = true;
    } else if (arg == "--device") {
      c.train.parallel.device = value();
    } else if (arg == "--no-tf32") {
      no_value();
      c.train.parallel.tf32 = false;
    } else if (arg == "--replicas") {
      c.train.parallel.replicas = static_cast<int>(parse_int(arg, value(), 1));
      if (c.train.parallel.replicas > 1024)
        usage_fail("--replicas: at most 1024, got ", c.train.parallel.replicas);
    } else if (arg == "--data") {
      c.train.data.train = value();
    } else if (arg == "--labels") {
      c.train.data.labels = value();
      if (c.train.data.labels.empty()) usage_fail("--labels: empty array name");
    } else if (arg == "--val-data") {
      c.train.data.val = value();
      if (c.train.data.val.empty())
        usage_fail("--val-data: empty spec (use 'none' for no validation)");
    } else if (arg == "--val-split") {
      c.train.data.val_split = parse_float(arg, value(), 0);
      if (c.train.data.val_split >= 1)
        usage_fail("--val-split: expected a fraction in [0, 1), got ", c.train.data.val_split);
    } else if (arg == "--epochs") {
      c.train.schedule.epochs = parse_int(arg, value(), 1);
      a.epochs_given = true;
    } else if (arg == "--steps") {
      c.train.schedule.steps = parse_int(arg, value(), 1);
      a.steps_given = true;
    } else if (arg == "--batch-size") {
      c.train.data.batch_size = parse_int(arg, value(), 1);
      a.batch_given = true;
    } else if (arg == "--global-batch-size") {
      c.train.data.global_batch = parse_int(arg, value(), 1);
      a.global_batch_given = true;
    } else if (arg == "--optimizer") {
      c.train.optimizer.kind = optimizer_kind(value());
    } else if (arg == "--lr") {
      c.train.schedule.lr = static_cast<float>(parse_float(arg, value(), 0, false));
    } else if (arg == "--momentum") {
      c.train.optimizer.momentum = static_cast<float>(parse_float(arg, value(), 0));
      if (c.train.optimizer.momentum >= 1) usage_fail("--momentum: expected a value in [0, 1)");
      a.momentum_given = true;
    } else if (arg == "--weight-decay") {
      c.train.optimizer.weight_decay = static_cast<float>(parse_float(arg, value(), 0));
    } else if (arg == "--lr-schedule") {
      c.train.schedule.lr_schedule = value();
    } else if (arg == "--clip-norm") {
      c.train.optimizer.clip_global_norm = static_cast<float>(parse_float(arg, value(), 0, false));
    } else if (arg == "--loss") {
      const std::string v = value();
      if (v.starts_with("output:")) {
        // The model computes its own loss: train output NAME as it is.
        if (v.size() == 7) usage_fail("--loss output:NAME needs the output's name");
        c.train.model.loss = passes::LossKind::kOutput;
        loss_output = v.substr(7);
      } else {
        if (v == "output") usage_fail("--loss output needs the output's name: output:NAME");
        c.train.model.loss = loss_kind(v);
      }
    } else if (arg == "--class-axis") {
      const std::string a = value();
      if (a != "1" && a != "-1") usage_fail(arg, ": expected 1 or -1, got '", a, "'");
      c.train.model.class_axis = a == "1" ? 1 : -1;
      c.train.model.class_axis_auto = false;
    } else if (arg == "--ignore-index") {
      c.train.model.ignore_index = parse_int(arg, value(), std::numeric_limits<int64_t>::min());
    } else if (arg == "--output-name") {
      c.train.model.output = value();
    } else if (arg == "--bn-mode") {
      const std::string m = value();
      if (m != "train" && m != "frozen") usage_fail(arg, ": expected train or frozen, got '", m, "'");
      c.train.model.trainable.freeze_batch_norm = m == "frozen";
    } else if (arg == "--untie-initializers") {
      no_value();
      c.train.model.trainable.untie_initializers = true;
    } else if (arg == "--precision") {
      const std::string v = value();
      const std::optional<graph::DataType> t = train::parse_precision(v);
      if (!t) usage_fail(arg, ": expected fp32, bf16 or fp16, got '", v, "'");
      c.train.model.precision = *t;
    } else if (arg == "--conv-algorithm") {
      const std::string v = value();
      const std::optional<passes::ConvAlgorithm> algo = passes::parse_conv_algorithm(v);
      if (!algo) usage_fail(arg, ": expected direct or winograd, got '", v, "'");
      c.train.model.conv_algorithm = *algo;
    } else if (arg == "--plain-layout") {
      no_value();
      c.train.model.blocked_layout = false;
    } else if (arg == "--unfused") {
      no_value();
      c.train.model.fuse_batchnorm_relu = false;
    } else if (arg == "--no-weight-copies") {
      no_value();
      c.train.model.weight_copies = false;
    } else if (arg == "--allow-emulation") {
      no_value();
      c.train.model.allow_emulation = true;
    } else if (arg == "--loss-scale") {
      c.train.model.loss_scaler.init = parse_float(arg, value(), 0, false);
    } else if (arg == "--loss-scale-growth-interval") {
      c.train.model.loss_scaler.growth_interval = parse_int(arg, value(), 1);
    } else if (arg == "--freeze") {
      c.train.model.trainable.freeze_regex = value();
    } else if (arg == "--trainable") {
      c.train.model.trainable.trainable_regex = value();
    } else if (arg == "--threads") {
      c.train.parallel.threads = static_cast<int>(parse_int(arg, value(), 1));
    } else if (arg == "--oversubscribe") {
      no_value();
      c.train.parallel.oversubscribe = true;
    } else if (arg == "--seed") {
      c.train.data.seed = static_cast<uint64_t>(parse_int(arg, value(), 0));
    } else if (arg == "--mean") {
      a.mean = value();
    } else if (arg == "--std") {
      a.std = value();
    } else if (arg == "--output") {
      c.output = path();
    } else if (arg == "--save-graph") {
      c.save_graph = path();
    } else if (arg == "--custom-op-lib") {
      c.train.model.custom_op_libs.push_back(path());
    } else if (arg == "--checkpoint-dir") {
      c.train.checkpoint.dir = path();
    } else if (arg == "--checkpoint-every") {
      c.train.checkpoint.every = parse_int(arg, value(), 1);
    } else if (arg == "--augment") {
      const std::string v = value();
      const std::optional<runtime::Augment> augment = runtime::parse_augment(v);
      if (!augment) usage_fail(arg, ": expected none, basic or imagenet, got '", v, "'");
      c.train.data.augment = *augment;
    } else if (arg == "--data-workers") {
      c.train.data.data_workers = static_cast<int>(parse_int(arg, value(), 1));
      if (c.train.data.data_workers > 256)
        usage_fail(arg, ": at most 256, got ", c.train.data.data_workers);
    } else if (arg == "--on-bad-image") {
      const std::string v = value();
      const std::optional<runtime::OnBadImage> on_bad = runtime::parse_on_bad_image(v);
      if (!on_bad) usage_fail(arg, ": expected stop or skip, got '", v, "'");
      c.train.data.on_bad_image = *on_bad;
    } else if (arg == "--on-nonfinite") {
      const std::string v = value();
      if (v != "stop" && v != "skip") usage_fail(arg, ": expected stop or skip, got '", v, "'");
      c.train.guard.on_nonfinite = v == "stop" ? train::OnNonFinite::kStop : train::OnNonFinite::kSkip;
    } else if (arg == "--max-nonfinite-skips") {
      c.train.guard.max_skips = parse_int(arg, value(), 1);
    } else if (arg == "--resume") {
      no_value();
      c.train.checkpoint.resume = true;
    } else if (arg == "--overwrite-checkpoints") {
      no_value();
      c.train.checkpoint.overwrite = true;
    } else if (arg == "--metrics-json") {
      c.metrics_json = path();
    } else if (arg == "--tensorboard") {
      c.tensorboard = path();
    } else if (arg == "--tensorboard-every") {
      c.tensorboard_every = parse_int(arg, value(), 0);
    } else if (arg == "--profile") {
      c.train.parallel.profile = path();
    } else if (arg == "--sync-batchnorm") {
      no_value();
      c.train.parallel.sync_batchnorm = true;
    } else if (arg == "--no-shard-updates") {
      no_value();
      c.train.parallel.shard_updates = false;
    } else if (arg == "--verify-ranks") {
      no_value();
      c.train.parallel.verify_ranks = true;
    } else if (arg == "--collective-timeout") {
      a.collective_timeout = parse_float(arg, value(), 0, false);
    } else if (arg == "--reduce-precision") {
      const std::string v = value();
      const std::optional<graph::DataType> t = train::parse_precision(v);
      if (t != graph::DataType::kFloat && t != graph::DataType::kBFloat16)
        usage_fail(arg, ": expected fp32 or bf16, got '", v, "'");
      c.train.parallel.reduce_precision = *t;
    } else if (arg == "--bucket-mb") {
      c.train.parallel.bucket_mb = parse_float(arg, value(), 0, false);
    } else {
      usage_fail("unknown option '", arg, "'");
    }
  }
  if (a.help || a.version) return a;
  if (!loss_output.empty()) {
    if (!c.train.model.output.empty() && c.train.model.output != loss_output)
      usage_fail("--loss output:", loss_output, " and --output-name ", c.train.model.output,
                 " name different outputs");
    c.train.model.output = loss_output;
  }
  if (c.train.model.path.empty()) usage_fail("no model given");
  if (a.epochs_given && a.steps_given) usage_fail("give either --epochs or --steps, not both");
  if (a.batch_given && a.global_batch_given)
    usage_fail("give either --batch-size or --global-batch-size, not both");
  if (c.train.data.global_batch > 0 && c.train.data.global_batch < c.train.parallel.replicas)
    usage_fail("--global-batch-size ", c.train.data.global_batch, " is smaller than --replicas ",
               c.train.parallel.replicas);
  if (c.train.data.val_split > 0 && !c.train.data.val.empty())
    usage_fail("give either --val-data or --val-split, not both");
  if (c.train.checkpoint.resume && c.train.checkpoint.dir.empty())
    usage_fail("--resume needs --checkpoint-dir");
  if (c.train.checkpoint.every > 0 && c.train.checkpoint.dir.empty())
    usage_fail("--checkpoint-every needs --checkpoint-dir");
  if (a.mean.empty() != a.std.empty()) usage_fail("give --mean and --std together");
  if (!a.mean.empty()) {
    try {
      c.train.data.normalization = runtime::parse_normalization(a.mean, a.std);
    } catch (const Error& e) {
      usage_fail(e.what());
    }
  }
  // `sgd` is plain SGD (momentum 0); an explicit --momentum > 0 makes it the momentum optimizer.
  if (c.train.optimizer.kind == passes::OptimizerKind::kSgd) {
    if (a.momentum_given && c.train.optimizer.momentum > 0) {
      c.train.optimizer.kind = passes::OptimizerKind::kMomentum;
    } else {
      c.train.optimizer.momentum = 0;
    }
  }
  // Pure syntax of the specs: a malformed one is a usage error like a bad number.
  try {
    runtime::parse_lr_schedule(c.train.schedule.lr_schedule, c.train.schedule.lr);
    runtime::parse_data_spec(c.train.data.train);
    if (!c.train.data.val.empty() && c.train.data.val != "none")
      runtime::parse_data_spec(c.train.data.val);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    usage_fail(e.what());
  }
  return a;
}


}  // namespace onnxtrain::tools
