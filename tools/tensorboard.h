// TensorBoard event files (--tensorboard DIR, issue #21): scalars in TensorBoard's own format, laid
// out as Keras' TensorBoard callback does, so `tensorboard --logdir DIR` overlays training and
// validation curves:
//   DIR/train/events.out.tfevents.<seconds>.<host>.<pid>.onnxtrain
//       epoch_loss, epoch_accuracy, epoch_learning_rate, epoch_samples_per_second (step = epoch,
//       0-based, as Keras) and batch_loss, batch_accuracy, batch_learning_rate every N steps
//       (step = the global step, 1-based)
//   DIR/validation/events.out.tfevents...: epoch_loss, epoch_accuracy (step = epoch)
// A file is a sequence of records: uint64 length, uint32 masked CRC-32C of those 8 bytes, the
// bytes of one tensorflow.Event protocol buffer, uint32 masked CRC-32C of them (all little
// endian). The first event holds file_version "brain.Event:2"; each scalar is an Event with
// wall_time, step and a Summary of one Value {tag, simple_value}. Encoded by hand: the two
// messages need five fields.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

namespace onnxtrain::tools {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) and TFRecord's mask of it.
uint32_t crc32c(std::string_view bytes);
uint32_t masked_crc32c(std::string_view bytes);

// One event file. Throws Error (naming the file) when it cannot be created or written.
class EventFile {
 public:
  // Creates `dir` (and parents) and a new file in it; writes the file_version event.
  explicit EventFile(const std::string& dir);
  ~EventFile();
  EventFile(const EventFile&) = delete;
  EventFile& operator=(const EventFile&) = delete;

  void scalar(std::string_view tag, int64_t step, double value);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::FILE* f_ = nullptr;
  std::string path_;
};

// The run's two files (train/ and validation/, created on first use).
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(std::string dir) : dir_(std::move(dir)) {}
  EventFile& train();
  EventFile& validation();
  void flush();

 private:
  std::string dir_;
  std::unique_ptr<EventFile> train_, validation_;
};

}  // namespace onnxtrain::tools
