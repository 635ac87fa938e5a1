// The streaming images: source. Up front only the file list and labels (class sub-folders or a
// CSV); a pool of worker threads decodes and transforms each batch's images when the loader's
// producer thread asks for it, so memory follows the prefetch depth, not the dataset size.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/data/augment.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/data/transform.h"

namespace onnxtrain::runtime {

// The listed examples of an images: spec (nothing decoded yet).
struct ImageFiles {
  std::vector<std::string> paths;
  std::vector<int64_t> labels;
  std::vector<std::string> classes;  // folder form: the sub-folder names (label k = classes[k])
  int64_t num_classes = 0;
};

// images:DIR: DIR/<class>/*.jpg|jpeg|png (any case), classes and files in sorted order, hidden
// entries skipped. Errors: DIR missing, no class folder, a class folder without images.
ImageFiles list_image_folder(const std::string& dir);
// images:FILE.csv: one `path,label` per line. The label is the text after the last comma, a
// non-negative integer class index; path is relative to the CSV's folder unless absolute. Blank
// lines and lines starting with '#' are skipped; a first line `path,label` is a header. Errors
// name FILE:LINE (a bad label, a missing image file, a line without a comma) or the file.
ImageFiles list_image_csv(const std::string& csv);
// True when an images: argument names a .csv file (by its extension, any case).
bool is_image_csv(const std::string& arg);

// A fixed set of threads that runs fn(0..n-1) for one call at a time (run blocks until all are
// done). run rethrows the exception of the lowest task that threw.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  int size() const { return static_cast<int>(threads_.size()); }
  void run(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void work();
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, next_ = 0, done_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

// The BatchFn of a dataset of listed image files (Dataset::is_image_files): rows
// [fill_begin, fill_end) of each batch are decoded on `options.workers` threads, transformed
// (augment.h; random numbers from (seed, epoch, storage index)) and normalized by `adapter`;
// labels cover every row. A file that fails to decode or exceeds the size caps: kStop throws
// its one-line error; kSkip uses the next readable example of the dataset (view order, wrapping
// around) for that row, image and label, and counts it in Batch::bad_images.
BatchFn image_batch_fn(Dataset data, InputAdapter adapter, uint64_t seed,
                       ImageStreamOptions options);

}  // namespace onnxtrain::runtime
