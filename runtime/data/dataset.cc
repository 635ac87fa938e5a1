// The Dataset container: shared immutable storage plus an optional index view (subsets for
// val_split share the pixels), and the label range check that names the file and offset.
#include "runtime/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "graph/error.h"
#include "runtime/data/augment.h"
#include "runtime/data/image_io.h"
#include "runtime/data/image_stream.h"
#include "runtime/data/random.h"
#include "runtime/finite.h"

namespace onnxtrain::runtime {

struct Dataset::Storage {
  std::vector<int64_t> example_shape;
  int64_t example_numel = 0;
  int64_t count = 0;
  std::vector<uint8_t> pixels;  // is_pixels
  std::vector<float> features;  // otherwise
  bool is_pixels = false;
  std::vector<int64_t> labels;  // has_labels: count x label_numel
  std::vector<int64_t> label_shape;
  int64_t label_numel = 1;
  std::vector<NamedArray> arrays;  // named datasets: each (count, ...)
  std::vector<int64_t> target_shape;
  int64_t target_numel = 0;
  std::vector<float> targets;  // otherwise
  int64_t num_classes = 0;
  bool has_truth = true;
  std::shared_ptr<const ImageFiles> files;  // streamed image files
};

namespace {

int64_t numel_of(const std::vector<int64_t>& dims, const std::string& name) {
  int64_t n = 1;
  for (int64_t d : dims) {
    OT_CHECK(d > 0, name, ": example dimension ", d, " must be positive");
    OT_CHECK(n <= INT64_MAX / d, name, ": example shape overflows int64");
    n *= d;
  }
  return n;
}

std::shared_ptr<Dataset::Storage> make_storage(const std::string& name, std::vector<int64_t> shape,
                                               size_t values) {
  auto s = std::make_shared<Dataset::Storage>();
  s->example_shape = std::move(shape);
  s->example_numel = numel_of(s->example_shape, name);
  OT_CHECK(values % static_cast<size_t>(s->example_numel) == 0, name, ": ", values,
           " feature values are not a whole number of examples of ", s->example_numel);
  s->count = static_cast<int64_t>(values) / s->example_numel;
  return s;
}

void set_labels(Dataset::Storage& s, const std::string& name, std::vector<int64_t> labels,
                std::optional<int64_t> padding_label = std::nullopt) {
  OT_CHECK(static_cast<int64_t>(labels.size()) == s.count * s.label_numel, name, ": ",
           labels.size(), " labels for ", s.count, " examples of ", s.label_numel);
  int64_t max_label = -1;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (padding_label && labels[i] == *padding_label) continue;
    OT_CHECK(labels[i] >= 0, name, ": label ", labels[i], " of example ",
             static_cast<int64_t>(i) / s.label_numel,
             s.label_numel > 1 ? cat(" (element ", static_cast<int64_t>(i) % s.label_numel, ")")
                               : std::string(),
             " is negative", padding_label ? "" : " (padding? give --ignore-index)");
    max_label = std::max(max_label, labels[i]);
  }
  s.labels = std::move(labels);
  s.num_classes = max_label + 1;
}

}  // namespace

Dataset Dataset::from_pixels(std::string name, std::vector<int64_t> example_shape,
                             std::vector<uint8_t> pixels, std::vector<int64_t> labels) {
  auto s = make_storage(name, std::move(example_shape), pixels.size());
  s->is_pixels = true;
  s->pixels = std::move(pixels);
  set_labels(*s, name, std::move(labels));
  Dataset d;
  d.storage_ = std::move(s);
  d.name_ = std::move(name);
  return d;
}

Dataset Dataset::from_floats(std::string name, std::vector<int64_t> example_shape,
                             std::vector<float> features, std::vector<int64_t> labels,
                             std::optional<int64_t> padding_label) {
  auto s = make_storage(name, std::move(example_shape), features.size());
  s->features = std::move(features);
  set_labels(*s, name, std::move(labels), padding_label);
  Dataset d;
  d.storage_ = std::move(s);
  d.name_ = std::move(name);
  return d;
}

Dataset Dataset::from_floats_with_targets(std::string name, std::vector<int64_t> example_shape,
                                          std::vector<float> features,
                                          std::vector<int64_t> target_shape,
                                          std::vector<float> targets) {
  auto s = make_storage(name, std::move(example_shape), features.size());
  s->features = std::move(features);
  s->target_numel = numel_of(target_shape, name);
  s->target_shape = std::move(target_shape);
  OT_CHECK(static_cast<int64_t>(targets.size()) == s->count * s->target_numel, name, ": ",
           targets.size(), " target values for ", s->count, " examples of ", s->target_numel);
  s->targets = std::move(targets);
  Dataset d;
  d.storage_ = std::move(s);
  d.name_ = std::move(name);
  return d;
}

Dataset Dataset::from_arrays(std::string name, std::vector<NamedArray> features,
                             const graph::Tensor& truth, std::optional<int64_t> padding_label) {
  OT_CHECK(!features.empty(), name, ": no arrays to feed the model");
  auto s = std::make_shared<Dataset::Storage>();
  s->has_truth = truth.rank() > 0;
  const graph::Tensor& rows = s->has_truth ? truth : features.front().second;
  OT_CHECK(rows.rank() >= 1 && rows.dims()[0] > 0, name, ": arrays must have shape (N, ...)",
           " with N > 0");
  s->count = rows.dims()[0];
  for (const NamedArray& a : features)
    OT_CHECK(a.second.rank() >= 1 && a.second.dims()[0] == s->count, name, ": array '", a.first,
             "' has ", a.second.rank() ? a.second.dims()[0] : 0, " rows, the labels ", s->count);
  std::vector<int64_t> tail;
  for (size_t i = 1; i < truth.dims().size(); ++i) tail.push_back(truth.dims()[i]);
  const graph::DataType t = truth.dtype();
  if (!s->has_truth) {
    s->num_classes = 0;
  } else if (t == graph::DataType::kInt64 || t == graph::DataType::kInt32) {
    s->label_numel = numel_of(tail, name);
    s->label_shape = std::move(tail);
    std::vector<int64_t> labels(static_cast<size_t>(truth.numel()));
    for (size_t i = 0; i < labels.size(); ++i)
      labels[i] = t == graph::DataType::kInt64 ? truth.data_as<int64_t>()[i]
                                               : truth.data_as<int32_t>()[i];
    set_labels(*s, name, std::move(labels), padding_label);
  } else if (t == graph::DataType::kFloat || t == graph::DataType::kDouble) {
    s->target_numel = numel_of(tail, name);
    s->target_shape = std::move(tail);
    s->targets.resize(static_cast<size_t>(truth.numel()));
    for (size_t i = 0; i < s->targets.size(); ++i)
      s->targets[i] = t == graph::DataType::kFloat
                          ? truth.data_as<float>()[i]
                          : static_cast<float>(truth.data_as<double>()[i]);
  } else {
    fail(name, ": labels must be int64/int32 (classes) or float32/float64 (targets), not ",
         graph::dtype_short_name(t));
  }
  s->arrays = std::move(features);
  Dataset d;
  d.storage_ = std::move(s);
  d.name_ = std::move(name);
  return d;
}

Dataset Dataset::from_image_files(std::string name, std::shared_ptr<const ImageFiles> files,
                                  std::vector<int64_t> example_shape) {
  OT_CHECK(files && !files->paths.empty(), name, ": no image files");
  OT_CHECK(example_shape.size() == 3 && (example_shape[0] == 1 || example_shape[0] == 3), name,
           ": image files need a model input (C,H,W) with C 1 or 3");
  auto s = std::make_shared<Dataset::Storage>();
  s->example_numel = numel_of(example_shape, name);
  s->example_shape = std::move(example_shape);
  s->count = static_cast<int64_t>(files->paths.size());
  set_labels(*s, name, files->labels);
  s->num_classes = std::max(s->num_classes, files->num_classes);
  s->files = std::move(files);
  Dataset d;
  d.storage_ = std::move(s);
  d.name_ = std::move(name);
  return d;
}

bool Dataset::is_image_files() const {
  return storage_ && storage_->files != nullptr;
}

const std::string& Dataset::image_path(int64_t i) const {
  OT_CHECK(is_image_files(), name_, ": not a dataset of image files");
  return storage_->files->paths[static_cast<size_t>(storage_index(i))];
}

int64_t Dataset::size() const {
  if (!storage_) return 0;
  return indices_ ? static_cast<int64_t>(indices_->size()) : storage_->count;
}
const std::vector<int64_t>& Dataset::example_shape() const {
  static const std::vector<int64_t> kNone;
  return storage_ ? storage_->example_shape : kNone;
}
int64_t Dataset::example_numel() const {
  return storage_ ? storage_->example_numel : 0;
}
bool Dataset::is_pixels() const {
  return storage_ && storage_->is_pixels;
}
int64_t Dataset::num_classes() const {
  return storage_ ? storage_->num_classes : 0;
}
bool Dataset::has_labels() const {
  return storage_ && storage_->has_truth && storage_->target_numel == 0;
}
bool Dataset::has_truth() const {
  return storage_ && storage_->has_truth;
}
const std::vector<int64_t>& Dataset::target_shape() const {
  static const std::vector<int64_t> kNone;
  return storage_ ? storage_->target_shape : kNone;
}
int64_t Dataset::target_numel() const {
  return storage_ ? storage_->target_numel : 0;
}

const std::vector<int64_t>& Dataset::label_shape() const {
  static const std::vector<int64_t> kNone;
  return storage_ ? storage_->label_shape : kNone;
}
int64_t Dataset::label_numel() const {
  return storage_ ? storage_->label_numel : 1;
}
bool Dataset::is_named() const {
  return storage_ && !storage_->arrays.empty();
}
const std::vector<NamedArray>& Dataset::arrays() const {
  static const std::vector<NamedArray> kNone;
  return storage_ ? storage_->arrays : kNone;
}

graph::Tensor Dataset::gather(size_t k, std::span<const int64_t> indices) const {
  OT_CHECK(is_named() && k < storage_->arrays.size(), name_, ": no array ", k);
  const graph::Tensor& a = storage_->arrays[k].second;
  std::vector<int64_t> dims = a.dims();
  dims[0] = static_cast<int64_t>(indices.size());
  graph::Tensor out(a.dtype(), dims);
  const size_t row = a.dims()[0] ? a.nbytes() / static_cast<size_t>(a.dims()[0]) : 0;
  const auto* src = reinterpret_cast<const uint8_t*>(a.data());
  auto* dst = reinterpret_cast<uint8_t*>(out.mutable_data());
  for (size_t i = 0; i < indices.size(); ++i)
    std::memcpy(dst + i * row, src + static_cast<size_t>(storage_index(indices[i])) * row, row);
  return out;
}

int64_t Dataset::storage_index(int64_t i) const {
  OT_CHECK(i >= 0 && i < size(), name_, ": example index ", i, " out of range [0, ", size(), ")");
  return indices_ ? (*indices_)[static_cast<size_t>(i)] : i;
}

void Dataset::read_example(int64_t i, float* out) const {
  const Storage& s = *storage_;
  int64_t k = storage_index(i);
  auto n = static_cast<size_t>(s.example_numel);
  size_t base = static_cast<size_t>(k) * n;
  if (s.files) {
    transform_image(decode_image_file(s.files->paths[static_cast<size_t>(k)]), s.example_shape,
                    Augment::kNone, nullptr, out);
  } else if (s.is_pixels) {
    const uint8_t* p = s.pixels.data() + base;
    for (size_t j = 0; j < n; ++j) out[j] = static_cast<float>(p[j]) * (1.0f / 255.0f);
  } else {
    std::copy_n(s.features.data() + base, n, out);
  }
}

int64_t Dataset::label(int64_t i) const {
  OT_CHECK(has_labels(), name_, ": has float targets, not class labels");
  OT_CHECK(storage_->label_numel == 1, name_, ": has ", storage_->label_numel,
           " labels per example");
  return storage_->labels[static_cast<size_t>(storage_index(i))];
}

void Dataset::read_labels(int64_t i, int64_t* out) const {
  OT_CHECK(has_labels(), name_, ": has float targets, not class labels");
  auto n = static_cast<size_t>(storage_->label_numel);
  std::copy_n(storage_->labels.data() + static_cast<size_t>(storage_index(i)) * n, n, out);
}

void Dataset::read_target(int64_t i, float* out) const {
  OT_CHECK(!has_labels(), name_, ": has class labels, not float targets");
  auto n = static_cast<size_t>(storage_->target_numel);
  std::copy_n(storage_->targets.data() + static_cast<size_t>(storage_index(i)) * n, n, out);
}

Dataset Dataset::subset(std::vector<int64_t> indices, std::string name) const {
  for (int64_t& i : indices) i = storage_index(i);
  Dataset d = *this;
  d.indices_ = std::move(indices);
  d.name_ = std::move(name);
  return d;
}

void Dataset::set_label_origin(std::string file, int64_t base, int64_t stride) {
  label_file_ = std::move(file);
  label_base_ = base;
  label_stride_ = stride;
}

void Dataset::check_finite() const {
  const Storage& s = *storage_;
  auto check = [&](const std::string& what, const float* p, int64_t n, int64_t per_row) {
    for (int64_t i = 0; i < n; ++i)
      OT_CHECK(std::isfinite(p[i]), name_, ": ", what, " row ", per_row > 0 ? i / per_row : i,
               " (as stored) is not finite (element ", per_row > 0 ? i % per_row : 0, " is ",
               nonfinite_text(p[i]), "); every step that draws it would be non-finite");
  };
  check("features", s.features.data(), static_cast<int64_t>(s.features.size()), s.example_numel);
  check("targets", s.targets.data(), static_cast<int64_t>(s.targets.size()), s.target_numel);
  for (const auto& [array, t] : s.arrays)
    if (auto bad = find_nonfinite(t)) {
      const int64_t rows = t.dims().empty() ? 1 : std::max<int64_t>(t.dims()[0], 1);
      const int64_t per_row = t.numel() / rows;
      fail(name_, ": array '", array, "' row ", bad->index / per_row,
           " is not finite (element ", bad->index % per_row, " is ", nonfinite_text(bad->value),
           "); every step that draws it would be non-finite");
    }
}

void Dataset::check_labels(int64_t classes) const {
  if (classes <= 0 || !has_labels()) return;
  const Storage& s = *storage_;
  for (int64_t i = 0; i < size(); ++i) {
    int64_t k = storage_index(i);
    for (int64_t j = 0; j < s.label_numel; ++j) {
      int64_t v = s.labels[static_cast<size_t>(k * s.label_numel + j)];
      if (v < classes) continue;
      std::string where = label_file_.empty() ? name_ : label_file_;
      if (s.label_numel > 1)
        fail(where, ": label ", v, " of example ", k, " (element ", j,
             ") is out of range for a model with ", classes, " classes");
      bool gz = where.size() > 3 && where.ends_with(".gz");
      if (label_stride_ > 0)
        fail(where, ": label ", v, " at ", gz ? "uncompressed " : "", "byte offset ",
             label_base_ + k * label_stride_, " (example ", k,
             ") is out of range for a model with ", classes, " classes");
      fail(where, ": label ", v, " of example ", k, " is out of range for a model with ", classes,
           " classes");
    }
  }
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> holdout_split(int64_t n, double fraction,
                                                                    uint64_t seed) {
  OT_CHECK(fraction >= 0 && fraction < 1, "val_split ", fraction, " must be in [0, 1)");
  auto val_count = static_cast<int64_t>(std::llround(static_cast<double>(n) * fraction));
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  DataRng rng(seed, kHoldoutStream);
  shuffle_with(order, rng);
  std::vector<int64_t> val(order.begin(), order.begin() + val_count);
  std::vector<int64_t> train(order.begin() + val_count, order.end());
  std::sort(val.begin(), val.end());
  std::sort(train.begin(), train.end());
  return {std::move(train), std::move(val)};
}

}  // namespace onnxtrain::runtime
