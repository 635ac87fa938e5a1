// The one writer behind every file the tools write (models, external data, .npy, checkpoints,
// profiles; issue #17). A regular file (or a new one) is written to a temporary file in the same
// folder, fsynced and renamed over the target, then the folder is fsynced: an interrupted or
// failed write (a full disk, a signal) leaves the previous file as it was and no partial file
// under the target's name. A symbolic link is followed: the file it points to is replaced, the
// link stays. An existing character device or named pipe (/dev/null, a FIFO someone reads) is
// written through in place — never renamed over, which would replace the device node or the
// pipe with a regular file. A directory, socket or block device is refused.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace onnxtrain::graph {

class OutputFile {
 public:
  // Opens for writing (Error naming the path when it cannot). Nothing reaches `path` itself
  // before commit() for a regular file.
  explicit OutputFile(const std::string& path);
  ~OutputFile();  // without commit(): the temporary file is removed, the target untouched
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Makes the bytes the file's content: fsync, rename over the target, fsync of its folder
  // (regular files); close (devices, pipes).
  void commit();
  // Where the bytes go: the target, or the file a symbolic link points to.
  const std::string& target() const { return target_; }

 private:
  std::string path_, target_, tmp_;  // tmp_ empty: written in place (device, pipe)
  int fd_ = -1;
  bool committed_ = false;
};

// The whole file at once through OutputFile.
void write_file(const std::string& path, std::string_view bytes);

// ---- before anything runs: the files a command will read and write
struct FileRole {
  std::string what;  // "--output", "the model", "--data", ...
  std::string path;
};
// Throws naming both roles when an output is the same file as an input or as another output:
// the same device and inode when both exist (hard and symbolic links included), else the same
// absolute, normalized path.
void check_distinct_files(const std::vector<FileRole>& inputs, const std::vector<FileRole>& outputs);
// Throws unless `out` can be written when the time comes: not a directory, its folder exists,
// and a file can be created in that folder (a test file, removed at once).
void check_writable(const FileRole& out);

}  // namespace onnxtrain::graph
