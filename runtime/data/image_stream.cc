// images:DIR / images:FILE.csv as a streaming source: the file listing, the worker pool, and the
// BatchFn that decodes one batch's rows in parallel (image_stream.h).
#include "runtime/data/image_stream.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <set>

#include "graph/error.h"
#include "runtime/data/image_io.h"

namespace onnxtrain::runtime {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> sorted_entries(const fs::path& dir, bool directories) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (directories ? e.is_directory() : (e.is_regular_file() && is_image_file_name(name)))
      out.push_back(e.path());
  }
  OT_CHECK(!ec, dir.string(), ": cannot list: ", ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

bool is_image_csv(const std::string& arg) { return lower_extension(arg) == ".csv"; }

ImageFiles list_image_folder(const std::string& dir) {
  std::error_code ec;
  OT_CHECK(fs::is_directory(dir, ec), "images:", dir, ": directory not found");
  ImageFiles out;
  std::vector<fs::path> classes = sorted_entries(dir, true);
  OT_CHECK(!classes.empty(), dir, ": no class sub-folders (images:DIR wants DIR/<class>/*.png)");
  for (size_t k = 0; k < classes.size(); ++k) {
    std::vector<fs::path> files = sorted_entries(classes[k], false);
    OT_CHECK(!files.empty(), classes[k].string(), ": class folder has no .jpg/.jpeg/.png files");
    out.classes.push_back(classes[k].filename().string());
    for (const auto& f : files) {
      out.paths.push_back(f.string());
      out.labels.push_back(static_cast<int64_t>(k));
    }
  }
  out.num_classes = static_cast<int64_t>(classes.size());
  return out;
}

ImageFiles list_image_csv(const std::string& csv) {
  std::error_code ec;
  OT_CHECK(fs::is_regular_file(csv, ec), "images:", csv, ": CSV file not found");
  std::ifstream in(csv);
  OT_CHECK(in.good(), csv, ": cannot open the CSV file");
  const fs::path base = fs::path(csv).parent_path();
  ImageFiles out;
  std::string line;
  int64_t max_label = -1;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    const std::string text = trim(line);
    if (text.empty() || text[0] == '#') continue;
    if (line_no == 1 && text == "path,label") continue;
    const size_t comma = text.rfind(',');
    OT_CHECK(comma != std::string::npos && comma > 0, csv, ":", line_no, ": expected path,label",
             " (got '", text, "')");
    const std::string path_text = trim(text.substr(0, comma));
    const std::string label_text = trim(text.substr(comma + 1));
    int64_t label = -1;
    const auto [end, err] =
        std::from_chars(label_text.data(), label_text.data() + label_text.size(), label);
    OT_CHECK(!label_text.empty() && err == std::errc() &&
                 end == label_text.data() + label_text.size() && label >= 0,
             csv, ":", line_no, ": label '", label_text,
             "' is not a class index (images:FILE.csv wants path,INDEX with INDEX an integer >= 0)");
    fs::path p(path_text);
    if (p.is_relative()) p = base / p;
    OT_CHECK(fs::is_regular_file(p, ec), csv, ":", line_no, ": image file '", p.string(),
             "' not found");
    OT_CHECK(is_image_file_name(p.string()), csv, ":", line_no, ": '", p.string(),
             "' is not a .jpg/.jpeg/.png file");
    out.paths.push_back(p.string());
    out.labels.push_back(label);
    max_label = std::max(max_label, label);
  }
  OT_CHECK(!in.bad(), csv, ": read error");
  OT_CHECK(!out.paths.empty(), csv, ": no images listed (expected lines path,label)");
  out.num_classes = max_label + 1;
  return out;
}

// ---- WorkerPool

WorkerPool::WorkerPool(int threads) {
  OT_CHECK(threads >= 1, "data workers ", threads, " must be >= 1");
  for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { work(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::run(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  std::unique_lock lock(mu_);
  fn_ = &fn;
  n_ = n, next_ = 0, done_ = 0;
  errors_.assign(static_cast<size_t>(n), nullptr);
  ++generation_;
  cv_.notify_all();
  done_cv_.wait(lock, [&] { return done_ == n_; });
  fn_ = nullptr;
  for (const std::exception_ptr& e : errors_)
    if (e) std::rethrow_exception(e);
}

void WorkerPool::work() {
  uint64_t seen = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || (generation_ != seen && next_ < n_); });
    if (stopping_) return;
    const int64_t task = next_++;
    if (next_ == n_) seen = generation_;  // this call's tasks are all handed out
    const std::function<void(int64_t)>& fn = *fn_;
    lock.unlock();
    std::exception_ptr error;
    try {
      fn(task);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    errors_[static_cast<size_t>(task)] = error;
    if (++done_ == n_) done_cv_.notify_all();
  }
}

// ---- the BatchFn

namespace {

struct ImageStream {
  Dataset data;
  InputAdapter adapter;
  uint64_t seed;
  ImageStreamOptions options;
  std::vector<int64_t> shape;  // the examples' (C,H,W) before normalization
  int64_t numel = 0;
  std::unique_ptr<WorkerPool> pool;  // created on the first batch (on the producer thread)
  std::mutex named_mu;
  std::set<int64_t> named;  // storage indices of the skipped files named through options.warn

  // Row `row` of the batch: example `index` (a dataset index) into x (numel floats before
  // normalization) and its label; returns whether a substitute was used.
  bool fill_row(int64_t index, int64_t epoch, float* x, int64_t* label) {
    const int64_t n = data.size();
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = (index + k) % n;
      try {
        const DecodedImage img = decode_image_file(data.image_path(i));
        DataRng rng = example_rng(seed, epoch, data.storage_index(i));
        transform_image(img, shape, options.augment, &rng, x);
        *label = data.label(i);
        return k > 0;
      } catch (const Error& e) {
        if (options.on_bad_image == OnBadImage::kStop) throw;
        if (options.warn && first_named(data.storage_index(i)))
          options.warn(cat(e.what(), " (skipped: --on-bad-image skip uses the next readable "
                                     "image in the list instead)"));
      }
    }
    fail(data.name(), ": no readable image among its ", n, " files");
  }

  // True the first time a file is skipped, for the first kNamedBadImages files.
  bool first_named(int64_t storage_index) {
    std::lock_guard lock(named_mu);
    if (named.size() >= static_cast<size_t>(kNamedBadImages)) return false;
    return named.insert(storage_index).second;
  }
};

}  // namespace

BatchFn image_batch_fn(Dataset data, InputAdapter adapter, uint64_t seed,
                       ImageStreamOptions options) {
  OT_CHECK(data.is_image_files(), data.name(), ": not a dataset of image files");
  auto s = std::make_shared<ImageStream>();
  s->shape = data.example_shape();
  s->numel = data.example_numel();
  s->data = std::move(data);
  s->adapter = std::move(adapter);
  s->seed = seed;
  s->options = std::move(options);
  OT_CHECK(s->adapter.output_numel() == s->numel, s->data.name(),
           ": the input adapter must keep the example shape");
  return [s](std::span<const int64_t> indices, Batch& out) {
    const auto n = static_cast<int64_t>(indices.size());
    const int64_t begin = std::clamp<int64_t>(out.fill_begin, 0, n);
    const int64_t end = out.fill_end < 0 ? n : std::clamp<int64_t>(out.fill_end, begin, n);
    out.fill_begin = begin, out.fill_end = end;
    std::vector<int64_t> dims{end - begin};
    dims.insert(dims.end(), s->shape.begin(), s->shape.end());
    out.inputs = graph::Tensor(graph::DataType::kFloat, dims);
    out.targets = graph::Tensor(graph::DataType::kInt64, {n});
    float* x = out.inputs.mutable_data_as<float>();
    int64_t* y = out.targets.mutable_data_as<int64_t>();
    // Rows outside the fill range are another process's: their listed labels (only counted).
    for (int64_t r = 0; r < n; ++r) y[r] = s->data.label(indices[r]);
    if (!s->pool) s->pool = std::make_unique<WorkerPool>(s->options.workers);
    std::atomic<int64_t> bad{0};
    const int64_t epoch = out.epoch;
    s->pool->run(end - begin, [&](int64_t k) {
      std::vector<float> raw(static_cast<size_t>(s->numel));
      if (s->fill_row(indices[begin + k], epoch, raw.data(), y + begin + k)) ++bad;
      s->adapter.apply(raw.data(), x + k * s->numel);
    });
    out.bad_images = bad.load();
  };
}

}  // namespace onnxtrain::runtime
