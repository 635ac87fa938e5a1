// In-memory training data: N examples of one shape (uint8 pixels or float32 features), or N
// rows of several named arrays in the dtypes the model's inputs declare (npz:, npy:NAME=FILE),
// with int64 class labels (one per example or per element, e.g. per token) or float32 target
// vectors, plus the spec parser and loaders (--data).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "graph/tensor.h"

namespace onnxtrain::runtime {

struct ImageFiles;  // image_stream.h

// A named array: row i is example i's value for the model input of the same name.
using NamedArray = std::pair<std::string, graph::Tensor>;

// mean/std applied per channel after pixels are scaled to [0,1]; one value applies to every
// channel. Both empty = no normalization.
struct Normalization {
  std::vector<float> mean;
  std::vector<float> std;
  bool empty() const { return mean.empty() && std.empty(); }
};

// Per-dataset default normalization (see load_dataset): fashion-mnist 0.2860/0.3530, mnist
// 0.1307/0.3081, images ImageNet (0.485,0.456,0.406)/(0.229,0.224,0.225) when RGB and none
// when grayscale, npy and synthetic none.
class Dataset {
 public:
  // Pixel data: one byte per element, read back scaled by 1/255.
  static Dataset from_pixels(std::string name, std::vector<int64_t> example_shape,
                             std::vector<uint8_t> pixels, std::vector<int64_t> labels);
  // A negative label is an error unless it equals `padding_label` (a label the loss ignores).
  static Dataset from_floats(std::string name, std::vector<int64_t> example_shape,
                             std::vector<float> features, std::vector<int64_t> labels,
                             std::optional<int64_t> padding_label = std::nullopt);
  // Regression targets: `targets` holds N x target_numel floats (no class labels).
  static Dataset from_floats_with_targets(std::string name, std::vector<int64_t> example_shape,
                                          std::vector<float> features,
                                          std::vector<int64_t> target_shape,
                                          std::vector<float> targets);

  // Named arrays (each (N, ...) in the dtype its model input declares) with `truth`: int32/int64
  // class labels (N) or (N, d1, ...) (per token), or float32/float64 targets (N, ...); an empty
  // `truth` (rank 0, no data) for a model that computes its own loss (has_truth() false).
  static Dataset from_arrays(std::string name, std::vector<NamedArray> features,
                             const graph::Tensor& truth,
                             std::optional<int64_t> padding_label = std::nullopt);

  // Listed image files (images:DIR, images:FILE.csv; image_stream.h), decoded when a batch
  // needs them: example_shape is the model input's (C,H,W) with C 1 or 3; labels as listed.
  static Dataset from_image_files(std::string name, std::shared_ptr<const ImageFiles> files,
                                  std::vector<int64_t> example_shape);

  Dataset() = default;
  // For messages: "fashion-mnist (train)", "npy:x.npy,y.npy".
  const std::string& name() const { return name_; }
  int64_t size() const;
  // One example without the batch dim: (1,28,28), (3,H,W), (784), ...
  const std::vector<int64_t>& example_shape() const;
  int64_t example_numel() const;
  bool is_pixels() const;
  // max label + 1 (or the sub-folder count of images:DIR); 0 when targets are float vectors.
  int64_t num_classes() const;
  bool has_labels() const;
  // False for named datasets without labels or targets (--loss output:NAME).
  bool has_truth() const;
  // Shape of one float target (empty when the dataset has class labels).
  const std::vector<int64_t>& target_shape() const;
  int64_t target_numel() const;

  // Shape of one example's labels: empty for one label per example, (T) per token, ...
  const std::vector<int64_t>& label_shape() const;
  int64_t label_numel() const;

  // Named datasets (from_arrays): the arrays, rows in storage order (use gather for rows).
  bool is_named() const;
  const std::vector<NamedArray>& arrays() const;
  // Rows `indices` (dataset indices) of array k: (indices.size(), dims past the batch...).
  graph::Tensor gather(size_t k, std::span<const int64_t> indices) const;

  // Streamed image files: the file of example i (image_batch_fn decodes them in batches).
  bool is_image_files() const;
  const std::string& image_path(int64_t i) const;

  // Example i as float32 (pixels scaled to [0,1]) into out[0, example_numel()); image files are
  // decoded here with the validation geometry (augment.h transform_image, Augment::kNone).
  void read_example(int64_t i, float* out) const;
  int64_t label(int64_t i) const;  // one label per example
  // Example i's label_numel() labels into out.
  void read_labels(int64_t i, int64_t* out) const;
  void read_target(int64_t i, float* out) const;

  // A view of some examples (indices into this dataset), sharing the storage.
  Dataset subset(std::vector<int64_t> indices, std::string name) const;

  const Normalization& default_normalization() const { return default_norm_; }
  void set_default_normalization(Normalization n) { default_norm_ = std::move(n); }
  // Where the labels came from, so a label the model cannot take is reported with the file
  // and byte offset: label i sits at base + i * stride (stride 0: report the index only).
  void set_label_origin(std::string file, int64_t base, int64_t stride);
  // Throws when a label is >= classes (classes > 0): names the file and byte offset (or the
  // example and element).
  void check_labels(int64_t classes) const;
  // Throws when a float feature, array or target is NaN or Inf, naming the dataset (its files),
  // the array and the row as stored: such a row makes every step that draws it non-finite.
  void check_finite() const;

  // Storage index of example i (tests use it to check subsets and shuffles).
  int64_t storage_index(int64_t i) const;

  struct Storage;  // the shared, immutable examples (dataset.cc)

 private:
  std::shared_ptr<const Storage> storage_;
  std::optional<std::vector<int64_t>> indices_;  // nullopt = all examples in storage order
  std::string name_;
  Normalization default_norm_;
  std::string label_file_;
  int64_t label_base_ = 0, label_stride_ = 0;
};

// --data / --val-data: fashion-mnist[:DIR] | mnist:DIR | npy:X.npy,Y.npy | images:DIR |
// synthetic:N | npz:FILE | npy:NAME=FILE,NAME=FILE,...
struct DataSpec {
  enum class Kind { kFashionMnist, kMnist, kNpy, kImages, kSynthetic, kNpz, kNamedNpy };
  Kind kind = Kind::kFashionMnist;
  std::string text;            // the spec as given, for messages
  std::string dir;             // fashion-mnist, mnist, images
  std::string x_path, y_path;  // npy
  int64_t count = 0;           // synthetic
  std::string path;            // npz
  std::vector<std::pair<std::string, std::string>> files;  // named npy: (array name, file)
  // npz and named npy: every array feeds the model input of its name (LoadOptions::inputs).
  bool named() const { return kind == Kind::kNpz || kind == Kind::kNamedNpy; }
};
DataSpec parse_data_spec(const std::string& text);
// What the labels of a file dataset (npy:, npz:) are, reading no more than the labels:
// integer classes (true) or float targets (false), and the dims of one example's labels (past
// the rows: () for one class per example, (T) per token). nullopt for built-in datasets and when
// the labels cannot be read (loading then says why).
struct LabelFacts {
  bool integer = false;
  std::vector<int64_t> example_dims;
};
std::optional<LabelFacts> label_facts(const DataSpec& spec, const std::string& labels_name);

// A model data input as the loaders see it: name, dtype and dims past the batch (-1: any size).
struct ModelInput {
  std::string name;
  graph::DataType dtype = graph::DataType::kFloat;
  std::vector<int64_t> dims;
  // Integer inputs: ids must be below this (rows of the Gather table it indexes); 0 = unknown.
  int64_t id_bound = 0;
};

struct LoadOptions {
  // The model's input dims without the batch dim, e.g. (1,28,28), (3,32,32) or (784).
  // synthetic:N uses it as the example shape; images:DIR resizes every image to its (H,W) when
  // it has rank 3 (otherwise every image must have the same size).
  std::vector<int64_t> model_input;
  // The model's class count: synthetic labels are drawn from [0, num_classes) (10 when 0).
  int64_t num_classes = 0;
  uint64_t seed = 0;  // synthetic content
  // Labels equal to this are padding the loss ignores (--ignore-index): allowed although
  // negative. Other negative labels are an error naming the file and index.
  std::optional<int64_t> padding_label = std::nullopt;
  // Every data input of the model. Named datasets feed each one the array of its name, converted
  // to its dtype (an error names the array and input on a dtype or shape that does not fit);
  // synthetic:N fills them all when there are several or one is not float (integer ids below
  // id_bound, other integer and bool inputs with 1s, as an attention mask wants).
  std::vector<ModelInput> inputs = {};
  // Named datasets: the array holding labels or targets; "" = none (every array feeds an
  // input, the model computes its own loss).
  std::string labels_name = "labels";
  // synthetic labels of one example: () one per example, (T) per token (dims > 0).
  std::vector<int64_t> label_dims = {};
};

struct LoadedData {
  Dataset train;
  std::optional<Dataset> test;  // the IDX t10k split when the files exist
};
LoadedData load_dataset(const DataSpec& spec, const LoadOptions& options);

// What the CLI's --data / --val-data / --val-split give.
struct DataConfig {
  std::string train_spec;
  // "" = val_split when > 0, else the dataset's test split, else none; "none" = no validation.
  std::string val_spec;
  double val_split = 0;  // fraction of the training set held out, in [0, 1)
  uint64_t seed = 0;     // holdout choice and synthetic content
};
struct TrainValData {
  Dataset train;
  std::optional<Dataset> val;
};
TrainValData load_train_val(const DataConfig& config, const LoadOptions& options);

// Splits [0, n) into (train, val) index lists, both sorted; val has round(n * fraction)
// examples chosen by seed alone.
std::pair<std::vector<int64_t>, std::vector<int64_t>> holdout_split(int64_t n, double fraction,
                                                                    uint64_t seed);

}  // namespace onnxtrain::runtime
