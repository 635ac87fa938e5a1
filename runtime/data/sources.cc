// Where datasets come from: the --data spec parser and one loader per kind (IDX files plain or
// gzip, .npy pairs, image folders, synthetic). Every size read from a file is checked against
// the file and a global cap before anything is allocated; errors name the file and offset.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "graph/error.h"
#include "graph/tensor.h"
#include "runtime/data/dataset.h"
#include "runtime/data/image_io.h"
#include "runtime/data/image_stream.h"
#include "runtime/data/random.h"
#include "runtime/data/transform.h"
#include "runtime/npy.h"

namespace onnxtrain::runtime {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxDatasetBytes = int64_t{8} << 30;
// deflate cannot expand more than ~1032:1; anything claiming more is lying about its size.
constexpr int64_t kMaxGzipRatio = 1100;
constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

std::string shape_text(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + ")";
}

// Reads IDX files through zlib, which passes plain files through unchanged.
class IdxReader {
 public:
  explicit IdxReader(std::string path) : path_(std::move(path)) {
    std::error_code ec;
    auto size = fs::file_size(path_, ec);
    OT_CHECK(!ec, path_, ": cannot read: ", ec.message());
    file_bytes_ = static_cast<int64_t>(size);
    f_ = gzopen(path_.c_str(), "rb");
    OT_CHECK(f_ != nullptr, path_, ": cannot open: ", std::strerror(errno));
    gzbuffer(f_, 1 << 17);
  }
  ~IdxReader() {
    if (f_) gzclose(f_);
  }
  IdxReader(const IdxReader&) = delete;
  IdxReader& operator=(const IdxReader&) = delete;

  // Header: 0x00 0x00, type 0x08 (unsigned byte), rank, then rank big-endian u32 dims.
  std::vector<int64_t> read_header(int rank, const char* what) {
    unsigned char magic[4];
    read_exact(magic, 4, "the IDX magic");
    uint32_t m = (uint32_t{magic[0]} << 24) | (uint32_t{magic[1]} << 16) |
                 (uint32_t{magic[2]} << 8) | magic[3];
    uint32_t want = 0x0800u | static_cast<uint32_t>(rank);
    OT_CHECK(m == want, path_, ": bad IDX magic 0x", hex(m), " at byte offset 0 (expected 0x",
             hex(want), " for unsigned-byte ", what, ")");
    std::vector<int64_t> dims(static_cast<size_t>(rank));
    for (auto& d : dims) {
      unsigned char b[4];
      int64_t at = pos_;
      read_exact(b, 4, "the IDX dimensions");
      d = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3];
      OT_CHECK(d > 0, path_, ": IDX dimension ", d, " at byte offset ", at, " must be positive");
    }
    return dims;
  }

  // The body must hold exactly `bytes`: more or less means the header's dims are wrong.
  std::vector<uint8_t> read_body(const std::vector<int64_t>& dims) {
    int64_t bytes = 1;
    for (int64_t d : dims) {
      OT_CHECK(bytes <= kMaxDatasetBytes / std::max<int64_t>(d, 1), path_, ": IDX dims ",
               shape_text(dims), " exceed the dataset limit of ", kMaxDatasetBytes, " bytes");
      bytes *= d;
    }
    bool direct = gzdirect(f_) == 1;
    int64_t limit = direct ? file_bytes_ - pos_ : file_bytes_ * kMaxGzipRatio;
    OT_CHECK(
        bytes <= limit, path_, ": IDX dims ", shape_text(dims), " need ", bytes,
        " bytes of data after byte offset ", pos_, " but the file ",
        direct ? cat("has ", limit) : cat("(", file_bytes_, " bytes of gzip) cannot hold that"),
        direct ? " (dims disagree with the file size)" : "");
    std::vector<uint8_t> data(static_cast<size_t>(bytes));
    int64_t start = pos_;
    int64_t got = read_some(data.data(), bytes);
    OT_CHECK(got == bytes, path_, ": file ends at byte offset ", start + got, " but IDX dims ",
             shape_text(dims), " need ", bytes, " bytes after offset ", start,
             " (dims disagree with the file size)");
    unsigned char extra[1];
    OT_CHECK(read_some(extra, 1) == 0, path_, ": unexpected data after byte offset ", pos_ - 1,
             ": IDX dims ", shape_text(dims), " account for ", start + bytes,
             " bytes (dims disagree with the file size)");
    return data;
  }

 private:
  static std::string hex(uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08X", v);
    return buf;
  }
  void read_exact(unsigned char* dst, int64_t n, const char* what) {
    int64_t at = pos_;
    int64_t got = read_some(dst, n);
    OT_CHECK(got == n, path_, ": file ends at byte offset ", at + got, " inside ", what);
  }
  // Reads up to n bytes; a gzip error or truncated stream fails with the offset reached.
  int64_t read_some(void* dst, int64_t n) {
    int64_t total = 0;
    auto* out = static_cast<unsigned char*>(dst);
    while (total < n) {
      auto chunk = static_cast<unsigned>(std::min<int64_t>(n - total, INT_MAX / 2));
      int r = gzread(f_, out + total, chunk);
      int errnum = Z_OK;
      const char* msg = gzerror(f_, &errnum);
      if (r < 0 || (errnum != Z_OK && errnum != Z_STREAM_END)) {
        // zlib inflates ahead into its own buffer, so the uncompressed offset is where this
        // read started; the compressed side tells where the damage is.
        std::string why = msg ? msg : "unknown zlib error";
        if (why.starts_with(path_ + ": ")) why = why.substr(path_.size() + 2);
        int64_t at = pos_ + std::max(r, 0);
        if (errnum == Z_BUF_ERROR)
          fail(path_, ": truncated gzip stream: the compressed data ends at byte offset ",
               file_bytes_, " before the stream does (", why, "; reading uncompressed offset ", at,
               ")");
        fail(path_, ": corrupt gzip data (", why, ") reading uncompressed byte offset ", at);
      }
      total += r;
      pos_ += r;
      if (r == 0) break;
    }
    return total;
  }

  std::string path_;
  gzFile f_ = nullptr;
  int64_t file_bytes_ = 0;
  int64_t pos_ = 0;  // uncompressed offset
};

// An IDX file name in DIR, plain or .gz, with '-' or '.' before "idx" (both are in use).
std::string find_idx(const std::string& dir, const std::string& prefix, const std::string& idx,
                     bool required) {
  for (const char* sep : {"-", "."})
    for (const char* ext : {"", ".gz"}) {
      std::string p = (fs::path(dir) / cat(prefix, sep, idx, ext)).string();
      std::error_code ec;
      if (fs::is_regular_file(p, ec)) return p;
    }
  OT_CHECK(!required, dir, ": no ", prefix, "-", idx, " or ", prefix, "-", idx,
           ".gz (IDX dataset files)");
  return "";
}

Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path,
                      const std::string& name) {
  IdxReader images(images_path);
  std::vector<int64_t> idims = images.read_header(3, "images");
  IdxReader labels(labels_path);
  std::vector<int64_t> ldims = labels.read_header(1, "labels");
  OT_CHECK(ldims[0] == idims[0], labels_path, ": ", ldims[0], " labels (count at byte offset 4)",
           " but ", images_path, " has ", idims[0], " images");
  std::vector<uint8_t> pixels = images.read_body(idims);
  std::vector<uint8_t> label_bytes = labels.read_body(ldims);
  std::vector<int64_t> label_values(label_bytes.begin(), label_bytes.end());
  Dataset d = Dataset::from_pixels(name, {1, idims[1], idims[2]}, std::move(pixels),
                                   std::move(label_values));
  d.set_label_origin(labels_path, 8, 1);
  return d;
}

LoadedData load_idx_dir(const std::string& dir, const std::string& kind, Normalization norm) {
  std::error_code ec;
  OT_CHECK(fs::is_directory(dir, ec), kind, ":", dir, ": directory not found");
  LoadedData out;
  std::string images = find_idx(dir, "train-images", "idx3-ubyte", true);
  std::string labels = find_idx(dir, "train-labels", "idx1-ubyte", true);
  out.train = load_idx_pair(images, labels, cat(kind, " (train)"));
  out.train.set_default_normalization(norm);
  std::string ti = find_idx(dir, "t10k-images", "idx3-ubyte", false);
  std::string tl = find_idx(dir, "t10k-labels", "idx1-ubyte", false);
  if (!ti.empty() && !tl.empty()) {
    out.test = load_idx_pair(ti, tl, cat(kind, " (test)"));
    out.test->set_default_normalization(std::move(norm));
  }
  return out;
}

std::vector<float> floats_of(const graph::Tensor& t, const std::string& path) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == graph::DataType::kFloat) {
    std::copy_n(t.data_as<float>(), v.size(), v.data());
  } else if (t.dtype() == graph::DataType::kDouble) {
    std::transform(t.data_as<double>(), t.data_as<double>() + v.size(), v.begin(),
                   [](double x) { return static_cast<float>(x); });
  } else {
    fail(path, ": dtype ", graph::dtype_short_name(t.dtype()), " is not float32 or float64");
  }
  return v;
}

// dims[1:], by index: GCC 12 warns (-Wfree-nonheap-object) on the iterator-range constructor.
std::vector<int64_t> tail_dims(const std::vector<int64_t>& dims) {
  std::vector<int64_t> out;
  for (size_t i = 1; i < dims.size(); ++i) out.push_back(dims[i]);
  return out;
}

LoadedData load_named(const DataSpec& spec, const LoadOptions& options);
LoadedData load_arrays(const DataSpec& spec, std::vector<NamedArray> arrays,
                       const LoadOptions& options);

LoadedData load_npy(const DataSpec& spec, const LoadOptions& options) {
  // npy:X,Y as npy:INPUT=X,labels=Y (X and Y as read here).
  auto as_named = [&](graph::Tensor x, graph::Tensor y) {
    DataSpec named = spec;
    named.kind = DataSpec::Kind::kNamedNpy;
    named.files = {{options.inputs[0].name, spec.x_path}, {options.labels_name, spec.y_path}};
    std::vector<NamedArray> arrays;
    arrays.emplace_back(options.inputs[0].name, std::move(x));
    arrays.emplace_back(options.labels_name, std::move(y));
    return load_arrays(named, std::move(arrays), options);
  };
  graph::Tensor x = read_npy(spec.x_path);
  graph::Tensor y = read_npy(spec.y_path);
  // A model with one integer (or double) input, or class labels per position (a segmentation
  // mask (N,H,W), per token (N,T)): the named path feeds X in the input's dtype and matches the
  // labels to the model's output.
  const bool int_labels =
      y.dtype() == graph::DataType::kInt64 || y.dtype() == graph::DataType::kInt32;
  if (options.inputs.size() == 1 &&
      (options.inputs[0].dtype != graph::DataType::kFloat ||
       (int_labels && (y.rank() > 2 || (y.rank() == 2 && y.dims()[1] != 1)))))
    return as_named(std::move(x), std::move(y));
  OT_CHECK(x.dtype() == graph::DataType::kFloat || x.dtype() == graph::DataType::kDouble,
           spec.x_path, ": features must be float32 (or float64), not ",
           graph::dtype_short_name(x.dtype()));
  OT_CHECK(x.rank() >= 1 && x.dims()[0] > 0, spec.x_path, ": features must have shape (N, ...)",
           " with N > 0, not ", shape_text(x.dims()));
  OT_CHECK(y.rank() >= 1 && y.dims()[0] == x.dims()[0], spec.y_path, ": shape ",
           shape_text(y.dims()), " does not have ", x.dims()[0], " rows like ", spec.x_path);
  std::vector<int64_t> example = tail_dims(x.dims());
  if (example.empty()) example.push_back(1);
  for (int64_t d : example)
    OT_CHECK(d > 0, spec.x_path, ": example shape ", shape_text(example), " has an empty dim");
  LoadedData out;
  auto yt = y.dtype();
  if (yt == graph::DataType::kInt64 || yt == graph::DataType::kInt32) {
    OT_CHECK(y.rank() == 1 || (y.rank() == 2 && y.dims()[1] == 1), spec.y_path,
             ": integer labels must have shape (N) or (N,1), not ", shape_text(y.dims()));
    std::vector<int64_t> labels(static_cast<size_t>(y.dims()[0]));
    for (size_t i = 0; i < labels.size(); ++i) {
      labels[i] = yt == graph::DataType::kInt64 ? y.data_as<int64_t>()[i] : y.data_as<int32_t>()[i];
      OT_CHECK(labels[i] >= 0 || labels[i] == options.padding_label, spec.y_path, ": label ",
               labels[i], " at index ", i, " is negative",
               options.padding_label ? "" : " (padding? give --ignore-index)");
    }
    out.train = Dataset::from_floats(spec.text, example, floats_of(x, spec.x_path),
                                     std::move(labels), options.padding_label);
    // .npy v1 data starts after a header numpy pads to 64 bytes; name the index, not a guess.
    out.train.set_label_origin(spec.y_path, 0, 0);
  } else if (yt == graph::DataType::kFloat || yt == graph::DataType::kDouble) {
    std::vector<int64_t> tshape = tail_dims(y.dims());
    out.train = Dataset::from_floats_with_targets(spec.text, example, floats_of(x, spec.x_path),
                                                  tshape, floats_of(y, spec.y_path));
  } else {
    fail(spec.y_path, ": labels must be int64/int32 (classes) or float32/float64 (targets), not ",
         graph::dtype_short_name(yt));
  }
  return out;
}

// ---- named datasets (npz:FILE, npy:NAME=FILE,...)

std::string input_text(const ModelInput& in) {
  std::string s = cat("'", in.name, "' [N");
  for (int64_t d : in.dims) s += d < 0 ? std::string(",?") : cat(",", d);
  return s + "] " + std::string(graph::dtype_short_name(in.dtype));
}

bool is_int_dtype(graph::DataType t) {
  using graph::DataType;
  switch (t) {
    case DataType::kInt8: case DataType::kInt16: case DataType::kInt32: case DataType::kInt64:
    case DataType::kUInt8: case DataType::kUInt16: case DataType::kUInt32: case DataType::kUInt64:
    case DataType::kBool:
      return true;
    default:
      return false;
  }
}

// Element i of an integer or bool tensor (uint64 above INT64_MAX saturates: out of any range).
int64_t int_at(const graph::Tensor& t, size_t i) {
  using graph::DataType;
  switch (t.dtype()) {
    case DataType::kInt8: return t.data_as<int8_t>()[i];
    case DataType::kInt16: return t.data_as<int16_t>()[i];
    case DataType::kInt32: return t.data_as<int32_t>()[i];
    case DataType::kInt64: return t.data_as<int64_t>()[i];
    case DataType::kUInt8: return t.data_as<uint8_t>()[i];
    case DataType::kBool: return t.data_as<uint8_t>()[i] != 0;
    case DataType::kUInt16: return t.data_as<uint16_t>()[i];
    case DataType::kUInt32: return t.data_as<uint32_t>()[i];
    case DataType::kUInt64:
      return static_cast<int64_t>(std::min<uint64_t>(t.data_as<uint64_t>()[i], INT64_MAX));
    default: fail("int_at: not an integer tensor");
  }
}

double real_at(const graph::Tensor& t, size_t i) {
  if (t.dtype() == graph::DataType::kFloat) return t.data_as<float>()[i];
  if (t.dtype() == graph::DataType::kDouble) return t.data_as<double>()[i];
  return static_cast<double>(int_at(t, i));
}

// `a` in the dtype `in` declares. Integers convert to any integer, bool (0/1 only) or float
// input; floats to float inputs only (token ids must be integers, not rounded floats).
graph::Tensor convert_for_input(const graph::Tensor& a, const ModelInput& in,
                                const std::string& where) {
  using graph::DataType;
  if (a.dtype() == in.dtype) return a;
  const bool from_int = is_int_dtype(a.dtype());
  const bool from_float = a.dtype() == DataType::kFloat || a.dtype() == DataType::kDouble;
  auto refuse = [&](const char* why) {
    fail(where, ": dtype ", graph::dtype_short_name(a.dtype()), " does not fit model input ",
         input_text(in), " (", why, ")");
  };
  if (!from_int && !from_float) refuse("supported array dtypes: integers, bool, f32, f64");
  graph::Tensor out(in.dtype, a.dims());
  const auto n = static_cast<size_t>(a.numel());
  switch (in.dtype) {
    case DataType::kFloat:
      for (size_t i = 0; i < n; ++i) out.mutable_data_as<float>()[i] = static_cast<float>(real_at(a, i));
      return out;
    case DataType::kDouble:
      for (size_t i = 0; i < n; ++i) out.mutable_data_as<double>()[i] = real_at(a, i);
      return out;
    case DataType::kInt64:
    case DataType::kInt32:
    case DataType::kBool:
      break;
    default:
      refuse("onnxtrain feeds data inputs of dtype f32, f64, i64, i32 and bool");
  }
  if (!from_int) refuse("ids and masks must be integers; save them as int64");
  for (size_t i = 0; i < n; ++i) {
    const int64_t v = int_at(a, i);
    if (in.dtype == DataType::kInt64) {
      out.mutable_data_as<int64_t>()[i] = v;
    } else if (in.dtype == DataType::kInt32) {
      OT_CHECK(v >= INT32_MIN && v <= INT32_MAX, where, ": value ", v, " at flat index ", i,
               " does not fit model input ", input_text(in));
      out.mutable_data_as<int32_t>()[i] = static_cast<int32_t>(v);
    } else {
      OT_CHECK(v == 0 || v == 1, where, ": value ", v, " at flat index ", i,
               " is not 0 or 1 for bool model input ", input_text(in));
      out.mutable_data_as<uint8_t>()[i] = static_cast<uint8_t>(v);
    }
  }
  return out;
}

std::string names_text(const std::vector<NamedArray>& arrays) {
  std::string s;
  for (const auto& [name, t] : arrays) s += (s.empty() ? "" : ", ") + name;
  return s;
}

std::string inputs_text(const std::vector<ModelInput>& inputs) {
  std::string s;
  for (const ModelInput& in : inputs) s += (s.empty() ? "" : ", ") + input_text(in);
  return s;
}

LoadedData load_arrays(const DataSpec& spec, std::vector<NamedArray> arrays,
                       const LoadOptions& options);

LoadedData load_named(const DataSpec& spec, const LoadOptions& options) {
  std::vector<NamedArray> arrays;
  if (spec.kind == DataSpec::Kind::kNpz) {
    arrays = read_npz(spec.path);
  } else {
    for (const auto& [name, file] : spec.files) arrays.emplace_back(name, read_npy(file));
  }
  return load_arrays(spec, std::move(arrays), options);
}

// The named arrays of `spec`, already read.
LoadedData load_arrays(const DataSpec& spec, std::vector<NamedArray> arrays,
                       const LoadOptions& options) {
  // Where an array came from, for messages: "train.npz:input_ids" or "ids.npy".
  auto origin = [&](const std::string& name) -> std::string {
    if (spec.kind == DataSpec::Kind::kNpz) return cat(spec.path, ":", name);
    for (const auto& [n, file] : spec.files)
      if (n == name) return file;
    return name;
  };
  // No labels name: the model computes its own loss and every array feeds an input.
  graph::Tensor truth;
  std::string truth_origin;
  if (!options.labels_name.empty()) {
    auto truth_at = std::find_if(arrays.begin(), arrays.end(), [&](const NamedArray& a) {
      return a.first == options.labels_name;
    });
    OT_CHECK(truth_at != arrays.end(), spec.text, ": no array named '", options.labels_name,
             "' for the labels (arrays: ", names_text(arrays), "; --labels NAME names another)");
    truth = std::move(truth_at->second);
    truth_origin = origin(truth_at->first);
    arrays.erase(truth_at);
    OT_CHECK(truth.rank() >= 1 && truth.dims()[0] > 0, truth_origin,
             ": labels must have shape (N, ...) with N > 0, not ", shape_text(truth.dims()));
  } else {
    OT_CHECK(!arrays.empty() && arrays[0].second.rank() >= 1, spec.text,
             ": the first array must have shape (N, ...)");
    truth_origin = origin(arrays[0].first);
  }
  const int64_t rows = truth.rank() ? truth.dims()[0] : arrays[0].second.dims()[0];
  std::vector<NamedArray> features;
  for (auto& [name, a] : arrays) {
    const std::string where = origin(name);
    OT_CHECK(a.rank() >= 1 && a.dims()[0] == rows, where, ": shape ", shape_text(a.dims()),
             " does not have ", rows, " rows like ", truth_origin);
    if (options.inputs.empty()) {
      features.emplace_back(name, std::move(a));
      continue;
    }
    auto in = std::find_if(options.inputs.begin(), options.inputs.end(),
                           [&](const ModelInput& m) { return m.name == name; });
    OT_CHECK(in != options.inputs.end(), where, ": array '", name,
             "' feeds no model input (the model's inputs: ", inputs_text(options.inputs), ")");
    const std::vector<int64_t> dims = tail_dims(a.dims());
    bool fits = dims.size() == in->dims.size();
    for (size_t k = 0; fits && k < dims.size(); ++k) fits = in->dims[k] < 0 || in->dims[k] == dims[k];
    OT_CHECK(fits, where, ": shape ", shape_text(a.dims()), " does not fit model input ",
             input_text(*in));
    features.emplace_back(name, convert_for_input(a, *in, where));
  }
  for (const ModelInput& in : options.inputs) {
    const bool fed = std::any_of(features.begin(), features.end(),
                                 [&](const NamedArray& a) { return a.first == in.name; });
    OT_CHECK(fed, spec.text, ": no array for model input ", input_text(in), " (arrays: ",
             names_text(features),
             options.labels_name.empty() ? std::string() : cat("; labels: '", options.labels_name, "'"),
             ")");
  }
  // Features in the model's input order (batches list them so).
  std::sort(features.begin(), features.end(), [&](const NamedArray& a, const NamedArray& b) {
    auto rank = [&](const std::string& n) {
      for (size_t k = 0; k < options.inputs.size(); ++k)
        if (options.inputs[k].name == n) return k;
      return options.inputs.size();
    };
    return rank(a.first) < rank(b.first);
  });
  LoadedData out;
  out.train = Dataset::from_arrays(spec.text, std::move(features), truth, options.padding_label);
  if (truth.rank() > 0) out.train.set_label_origin(truth_origin, 0, 0);
  return out;
}

// synthetic:N for a model whose inputs are not one float tensor: ids below each input's bound,
// 1s for other integer/bool inputs (masks), uniform [0,1) floats; labels of label_dims.
LoadedData load_synthetic_named(const DataSpec& spec, const LoadOptions& options) {
  DataRng rng(options.seed, kSyntheticStream);
  std::vector<NamedArray> features;
  for (const ModelInput& in : options.inputs) {
    std::vector<int64_t> dims{spec.count};
    for (int64_t d : in.dims) {
      OT_CHECK(d > 0, spec.text, ": model input ", input_text(in),
               " has a dimension of no fixed size (synthetic data needs fixed sizes; give npz:)");
      dims.push_back(d);
    }
    graph::Tensor t(graph::DataType::kDouble, dims);
    OT_CHECK(t.numel() <= kMaxDatasetBytes / 8, spec.text, ": model input ", input_text(in),
             " x ", spec.count, " examples exceeds the dataset limit");
    double* v = t.mutable_data_as<double>();
    const bool ints = is_int_dtype(in.dtype);
    for (int64_t i = 0; i < t.numel(); ++i)
      v[i] = !ints ? rng.unit_float()
             : in.id_bound > 0 && in.dtype != graph::DataType::kBool
                 ? static_cast<double>(rng.below(static_cast<uint64_t>(in.id_bound)))
                 : 1.0;
    if (ints) {  // through int64 so the integer conversion rules apply
      graph::Tensor i64(graph::DataType::kInt64, dims);
      for (int64_t i = 0; i < t.numel(); ++i)
        i64.mutable_data_as<int64_t>()[i] = static_cast<int64_t>(v[i]);
      t = std::move(i64);
    }
    features.emplace_back(in.name, convert_for_input(t, in, spec.text));
  }
  std::vector<int64_t> label_dims{spec.count};
  for (int64_t d : options.label_dims) {
    OT_CHECK(d > 0, spec.text, ": the labels' shape is not fixed (synthetic data needs it)");
    label_dims.push_back(d);
  }
  graph::Tensor labels(graph::DataType::kInt64, label_dims);
  const int64_t classes = options.num_classes > 0 ? options.num_classes : 10;
  for (int64_t i = 0; i < labels.numel(); ++i)
    labels.mutable_data_as<int64_t>()[i] = static_cast<int64_t>(rng.below(static_cast<uint64_t>(classes)));
  LoadedData out;
  out.train = Dataset::from_arrays(spec.text, std::move(features), labels);
  return out;
}

// Bilinear resize of 8-bit CHW, rounding back to bytes.
std::vector<uint8_t> resize_u8(const DecodedImage& img, int64_t oh, int64_t ow) {
  std::vector<float> src(img.chw.begin(), img.chw.end());
  std::vector<float> dst(static_cast<size_t>(img.channels * oh * ow));
  resize_bilinear(src.data(), img.channels, img.height, img.width, dst.data(), oh, ow);
  std::vector<uint8_t> out(dst.size());
  for (size_t i = 0; i < dst.size(); ++i)
    out[i] = static_cast<uint8_t>(std::clamp(dst[i] + 0.5f, 0.0f, 255.0f));
  return out;
}

const Normalization kImageNetNorm{{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};

// images:DIR and images:FILE.csv for a model input (C,H,W) with C 1 or 3: only the file list
// now; image_batch_fn decodes each batch. Default normalization ImageNet's when C is 3.
LoadedData stream_images(const DataSpec& spec, const LoadOptions& options) {
  auto files = std::make_shared<ImageFiles>(is_image_csv(spec.dir) ? list_image_csv(spec.dir)
                                                                   : list_image_folder(spec.dir));
  LoadedData out;
  out.train = Dataset::from_image_files(spec.text, std::move(files), options.model_input);
  if (options.model_input[0] == 3) out.train.set_default_normalization(kImageNetNorm);
  return out;
}

// images:DIR for a model without an image input (C,H,W), e.g. a flat vector: every image
// decoded now, all of one size, held in memory (capped by kMaxDatasetBytes).
LoadedData load_images(const DataSpec& spec, const LoadOptions& options) {
  const std::vector<int64_t>& m = options.model_input;
  if (m.size() == 3 && (m[0] == 1 || m[0] == 3) && m[1] > 0 && m[2] > 0)
    return stream_images(spec, options);
  OT_CHECK(!is_image_csv(spec.dir), spec.text, ": images:FILE.csv needs a model input (C,H,W) ",
           "with 1 or 3 channels");
  const ImageFiles listed = list_image_folder(spec.dir);
  bool resize = options.model_input.size() == 3;
  int64_t h = resize ? options.model_input[1] : 0, w = resize ? options.model_input[2] : 0;
  std::vector<DecodedImage> images;
  std::vector<int64_t> labels;
  std::string first_file;
  int64_t bytes = 0;
  for (size_t i = 0; i < listed.paths.size(); ++i) {
    const fs::path f = listed.paths[i];
    DecodedImage img = decode_image_file(f.string());
    if (!resize && images.empty()) {
      h = img.height, w = img.width;
      first_file = f.string();
    }
    OT_CHECK(resize || (img.height == h && img.width == w), f.string(), ": image is ", img.width,
             "x", img.height, " but ", first_file, " is ", w, "x", h,
             " (mixed sizes need a model input (C,H,W) to resize to)");
    if (img.height != h || img.width != w) {
      img.chw = resize_u8(img, h, w);
      img.height = h, img.width = w;
    }
    bytes += 3 * h * w;
    OT_CHECK(bytes <= kMaxDatasetBytes, f.string(), ": ", spec.text,
             " exceeds the dataset limit of ", kMaxDatasetBytes, " bytes");
    images.push_back(std::move(img));
    labels.push_back(listed.labels[i]);
  }
  int64_t c = 1;
  for (const auto& img : images) c = std::max(c, img.channels);
  int64_t plane = h * w;
  std::vector<uint8_t> pixels(static_cast<size_t>(static_cast<int64_t>(images.size()) * c * plane));
  for (size_t i = 0; i < images.size(); ++i) {
    uint8_t* dst = pixels.data() + static_cast<int64_t>(i) * c * plane;
    for (int64_t ch = 0; ch < c; ++ch)  // a gray image in an RGB dataset: replicate the plane
      std::copy_n(images[i].chw.data() + (images[i].channels == 1 ? 0 : ch) * plane, plane,
                  dst + ch * plane);
    images[i].chw = {};
  }
  LoadedData out;
  out.train = Dataset::from_pixels(spec.text, {c, h, w}, std::move(pixels), std::move(labels));
  if (c == 3) out.train.set_default_normalization(kImageNetNorm);
  return out;
}

LoadedData load_synthetic(const DataSpec& spec, const LoadOptions& options) {
  const bool one_float_input = options.inputs.size() <= 1 &&
                               (options.inputs.empty() ||
                                options.inputs[0].dtype == graph::DataType::kFloat);
  if (!one_float_input || !options.label_dims.empty()) return load_synthetic_named(spec, options);
  OT_CHECK(!options.model_input.empty(), spec.text,
           ": synthetic data needs the model's input shape");
  int64_t numel = 1;
  for (int64_t d : options.model_input) {
    OT_CHECK(d > 0, spec.text, ": model input shape ", shape_text(options.model_input),
             " has a non-positive dim");
    numel *= d;
    OT_CHECK(numel <= kMaxDatasetBytes / 4, spec.text, ": model input too large");
  }
  OT_CHECK(spec.count <= kMaxDatasetBytes / 4 / numel, spec.text, ": ", spec.count, " examples of ",
           shape_text(options.model_input), " exceed the dataset limit of ", kMaxDatasetBytes,
           " bytes");
  int64_t classes = options.num_classes > 0 ? options.num_classes : 10;
  DataRng rng(options.seed, kSyntheticStream);
  std::vector<float> features(static_cast<size_t>(spec.count * numel));
  for (float& v : features) v = rng.unit_float();
  std::vector<int64_t> labels(static_cast<size_t>(spec.count));
  for (int64_t& l : labels) l = static_cast<int64_t>(rng.below(static_cast<uint64_t>(classes)));
  LoadedData out;
  out.train =
      Dataset::from_floats(spec.text, options.model_input, std::move(features), std::move(labels));
  return out;
}

}  // namespace

DataSpec parse_data_spec(const std::string& text) {
  DataSpec spec;
  spec.text = text;
  auto colon = text.find(':');
  std::string kind = text.substr(0, colon);
  std::string arg = colon == std::string::npos ? "" : text.substr(colon + 1);
  bool has_arg = colon != std::string::npos;
  auto need_arg = [&](const char* form) {
    OT_CHECK(has_arg && !arg.empty(), "data spec '", text, "': expected ", form);
  };
  if (kind == "fashion-mnist") {
    spec.kind = DataSpec::Kind::kFashionMnist;
    if (has_arg) need_arg("fashion-mnist or fashion-mnist:DIR");
    spec.dir = has_arg ? arg : kFashionMnistDir;
  } else if (kind == "mnist") {
    spec.kind = DataSpec::Kind::kMnist;
    need_arg("mnist:DIR");
    spec.dir = arg;
  } else if (kind == "images") {
    spec.kind = DataSpec::Kind::kImages;
    need_arg("images:DIR or images:FILE.csv");
    spec.dir = arg;
  } else if (kind == "npz") {
    spec.kind = DataSpec::Kind::kNpz;
    need_arg("npz:FILE (arrays named after the model's inputs, and 'labels')");
    spec.path = arg;
  } else if (kind == "npy" && arg.find('=') != std::string::npos) {
    spec.kind = DataSpec::Kind::kNamedNpy;
    for (size_t at = 0; at <= arg.size();) {
      size_t end = arg.find(',', at);
      if (end == std::string::npos) end = arg.size();
      const std::string item = arg.substr(at, end - at);
      const size_t eq = item.find('=');
      OT_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < item.size(), "data spec '", text,
               "': expected npy:NAME=FILE,NAME=FILE,... ('", item, "' is not NAME=FILE)");
      const std::string name = item.substr(0, eq);
      for (const auto& [n, f] : spec.files)
        OT_CHECK(n != name, "data spec '", text, "': array '", name, "' is given twice");
      spec.files.emplace_back(name, item.substr(eq + 1));
      at = end + 1;
    }
  } else if (kind == "npy") {
    spec.kind = DataSpec::Kind::kNpy;
    need_arg("npy:X.npy,Y.npy");
    auto comma = arg.find(',');
    OT_CHECK(comma != std::string::npos && comma > 0 && comma + 1 < arg.size() &&
                 arg.find(',', comma + 1) == std::string::npos,
             "data spec '", text, "': expected npy:X.npy,Y.npy (two files, one comma)");
    spec.x_path = arg.substr(0, comma);
    spec.y_path = arg.substr(comma + 1);
  } else if (kind == "synthetic") {
    spec.kind = DataSpec::Kind::kSynthetic;
    need_arg("synthetic:N");
    OT_CHECK(arg.size() <= 12 && arg.find_first_not_of("0123456789") == std::string::npos,
             "data spec '", text, "': N must be a positive integer (synthetic:N)");
    spec.count = std::stoll(arg);
    OT_CHECK(spec.count > 0, "data spec '", text, "': N must be a positive integer");
  } else if (const std::string ext = lower_extension(text); ext == ".npz" || ext == ".csv") {
    // A bare FILE.npz or FILE.csv (what a user types first) means npz:FILE / images:FILE.csv.
    DataSpec bare = parse_data_spec((ext == ".npz" ? "npz:" : "images:") + text);
    bare.text = text;
    return bare;
  } else {
    fail("data spec '", text, "': unknown kind '", kind,
         "' (expected fashion-mnist, mnist:DIR, npy:X.npy,Y.npy, npy:NAME=FILE,..., npz:FILE, ",
         "images:DIR, images:FILE.csv or synthetic:N)");
  }
  return spec;
}

std::optional<LabelFacts> label_facts(const DataSpec& spec, const std::string& labels_name) {
  std::optional<graph::Tensor> truth;
  try {
    switch (spec.kind) {
      case DataSpec::Kind::kNpy:
        truth = read_npy(spec.y_path);
        break;
      case DataSpec::Kind::kNpz:
        truth = read_npz_array(spec.path, labels_name);
        break;
      case DataSpec::Kind::kNamedNpy:
        for (const auto& [name, file] : spec.files)
          if (name == labels_name) truth = read_npy(file);
        break;
      default:
        return std::nullopt;  // built-in datasets: the model's output shape decides
    }
  } catch (const Error&) {
    return std::nullopt;
  }
  if (!truth || truth->rank() < 1) return std::nullopt;
  LabelFacts facts;
  if (is_int_dtype(truth->dtype()) && truth->dtype() != graph::DataType::kBool)
    facts.integer = true;
  else if (!graph::is_float_dtype(truth->dtype()))
    return std::nullopt;
  facts.example_dims.assign(truth->dims().begin() + 1, truth->dims().end());
  return facts;
}

LoadedData load_dataset(const DataSpec& spec, const LoadOptions& options) {
  LoadedData out;
  switch (spec.kind) {
    case DataSpec::Kind::kFashionMnist:
      out = load_idx_dir(spec.dir, "fashion-mnist", {{0.2860f}, {0.3530f}});
      break;
    case DataSpec::Kind::kMnist:
      out = load_idx_dir(spec.dir, "mnist", {{0.1307f}, {0.3081f}});
      break;
    case DataSpec::Kind::kNpy:
      out = load_npy(spec, options);
      break;
    case DataSpec::Kind::kImages:
      out = load_images(spec, options);
      break;
    case DataSpec::Kind::kSynthetic:
      out = load_synthetic(spec, options);
      break;
    case DataSpec::Kind::kNpz:
    case DataSpec::Kind::kNamedNpy:
      out = load_named(spec, options);
      break;
  }
  out.train.check_labels(options.num_classes);
  if (out.test) out.test->check_labels(options.num_classes);
  out.train.check_finite();
  if (out.test) out.test->check_finite();
  return out;
}

TrainValData load_train_val(const DataConfig& config, const LoadOptions& options) {
  OT_CHECK(config.val_split >= 0 && config.val_split < 1, "--val-split ", config.val_split,
           " must be in [0, 1)");
  bool explicit_val = !config.val_spec.empty() && config.val_spec != "none";
  OT_CHECK(!(explicit_val && config.val_split > 0),
           "give either --val-data or --val-split, not both");
  LoadOptions train_options = options;
  train_options.seed = config.seed;
  LoadedData train = load_dataset(parse_data_spec(config.train_spec), train_options);
  TrainValData out;
  if (explicit_val) {
    LoadOptions val_options = train_options;
    val_options.seed = config.seed ^ 0x9E3779B97F4A7C15ull;  // synthetic val != synthetic train
    LoadedData val = load_dataset(parse_data_spec(config.val_spec), val_options);
    out.val = val.test ? std::move(*val.test) : std::move(val.train);
    out.train = std::move(train.train);
  } else if (config.val_split > 0) {
    auto [train_idx, val_idx] = holdout_split(train.train.size(), config.val_split, config.seed);
    OT_CHECK(!train_idx.empty() && !val_idx.empty(), config.train_spec, ": --val-split ",
             config.val_split, " of ", train.train.size(), " examples leaves an empty split");
    out.val = train.train.subset(std::move(val_idx), cat(config.train_spec, " (val split)"));
    out.train = train.train.subset(std::move(train_idx), cat(config.train_spec, " (train split)"));
  } else {
    out.train = std::move(train.train);
    if (config.val_spec != "none" && train.test) out.val = std::move(*train.test);
  }
  return out;
}

}  // namespace onnxtrain::runtime
