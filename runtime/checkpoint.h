// Checkpoint files: ordered named tensors + string metadata, written atomically and read back
// with every size and checksum verified; plus the ckpt-<step>.otck directory helpers.
//
// File layout (.otck, version 1, all integers little-endian):
//   header   32 bytes  magic "OTCKPT\r\n" | u32 version = 1 | u32 flags = 0 |
//                      u64 record_count | u32 crc32(bytes 0..23) | u32 zero
//   record   24 bytes  u32 kind (1 = tensor, 2 = metadata) | u32 name_len | u64 payload_len |
//                      u32 crc32(these 16 bytes + name + payload) | u32 zero
//            then name (UTF-8, no terminator) and payload:
//              tensor:   i32 dtype (ONNX value) | u32 rank | i64 dims[rank] | data, where data
//                        is the packed element bytes, or for strings per element
//                        u64 length + bytes
//              metadata: the value bytes
//   trailer  24 bytes  magic "OTCKEND\n" | u64 record_count |
//                      u32 crc32(every byte before the trailer) | u32 zero
// Records are in the checkpoint's order: metadata (sorted by key), then tensors. The file ends
// exactly after the trailer.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/tensor.h"

namespace onnxtrain::runtime {

struct NamedTensor {
  std::string name;
  graph::Tensor tensor;
};

struct Checkpoint {
  std::vector<NamedTensor> tensors;  // in order; names unique
  // step, epoch, RNG state, data position, options hash, ... as the trainer chooses.
  std::map<std::string, std::string> metadata;

  // Appends; throws Error on a duplicate name.
  void add_tensor(const std::string& name, graph::Tensor tensor);
  // nullptr when absent.
  const graph::Tensor* find_tensor(const std::string& name) const;
  // Throws Error naming the key when absent.
  const std::string& meta(const std::string& key) const;
};

// Writes `path.tmp.<pid>`, fsyncs it, renames it over `path` and fsyncs the folder: a crash
// at any point leaves either the previous file or the complete new one. Throws Error (and
// removes the temporary file) on any failure.
void write_checkpoint(const std::string& path, const Checkpoint& ckpt);
// Verifies magic, version, every size against the file length before allocating, every
// record's checksum and the whole-file checksum. Throws a one-line Error naming the file, the
// record and the byte offset for a truncated, corrupt or foreign file.
Checkpoint read_checkpoint(const std::string& path);
// Only the metadata records (they come first), with their checksums checked; no tensor is read.
// For telling whose a checkpoint is without reading its tensors.
Checkpoint read_checkpoint_metadata(const std::string& path);

// ---- directories of checkpoints: <dir>/ckpt-<step>.otck ----

// "ckpt-<step>.otck".
std::string checkpoint_file_name(int64_t step);
struct CheckpointFile {
  int64_t step = 0;
  std::string path;
};
// Files named exactly ckpt-<decimal step>.otck, by ascending step; temporary files
// (*.tmp.*) and anything else are ignored. A missing folder gives an empty list.
std::vector<CheckpointFile> list_checkpoints(const std::string& dir);

struct LoadedCheckpoint {
  CheckpointFile file;
  Checkpoint ckpt;
};
// Reads the newest checkpoint that reads back completely, skipping newer ones that fail
// (their Error messages are appended to `skipped` when given). nullopt when none reads.
std::optional<LoadedCheckpoint> load_latest_checkpoint(const std::string& dir,
                                                       std::vector<std::string>* skipped = nullptr);
// The metadata key naming the run that wrote a checkpoint (a random id, kept across --resume).
inline constexpr const char* kRunIdKey = "run_id";
// Deletes all but the `keep_last` newest checkpoints of run `run_id` (by step): only files whose
// metadata reads back and names that run. Files of other runs, older files without a run id and
// unreadable ones are never deleted. Returns the deleted paths.
std::vector<std::string> prune_checkpoints(const std::string& dir, const std::string& run_id,
                                           int keep_last);

}  // namespace onnxtrain::runtime
