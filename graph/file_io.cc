// OutputFile (file_io.h).
#include "graph/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "graph/error.h"

namespace onnxtrain::graph {

namespace fs = std::filesystem;

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

}  // namespace

OutputFile::OutputFile(const std::string& path) : path_(path), target_(path) {
  OT_CHECK(!path.empty(), "cannot write a file with an empty name");
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    // Replace what the link points to, keep the link (a dangling one: create its target).
    std::error_code ec;
    const fs::path resolved = fs::weakly_canonical(fs::path(path), ec);
    OT_CHECK(!ec, path, ": cannot resolve the symbolic link: ", ec.message());
    target_ = resolved.string();
  }
  if (::stat(target_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
      // In place: a pipe without a reader fails at once (O_NONBLOCK) instead of hanging.
      fd_ = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC | (S_ISFIFO(st.st_mode) ? O_NONBLOCK : 0));
      OT_CHECK(fd_ >= 0, path, ": cannot open ",
               S_ISFIFO(st.st_mode) ? "the named pipe (no reader?)" : "the device", " for writing: ",
               errno_text());
      if (S_ISFIFO(st.st_mode)) ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
      return;
    }
    fail(path, ": is ", kind_of(st.st_mode), "; refusing to write over it");
  }
  tmp_ = target_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  OT_CHECK(fd_ >= 0, path, ": cannot create '", tmp_, "': ", errno_text());
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutputFile::write(const void* data, size_t n) {
  OT_CHECK(fd_ >= 0 && !committed_, path_, ": write after commit");
  const char* c = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, c, n);
    if (w < 0 && errno == EINTR) continue;
    OT_CHECK(w > 0, path_, ": write failed (", errno_text(), "); the previous file is unchanged");
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void OutputFile::commit() {
  OT_CHECK(fd_ >= 0 && !committed_, path_, ": commit twice");
  if (tmp_.empty()) {  // device or pipe: nothing to rename
    const int fd = fd_;
    fd_ = -1;
    committed_ = true;
    OT_CHECK(::close(fd) == 0, path_, ": close failed: ", errno_text());
    return;
  }
  OT_CHECK(::fsync(fd_) == 0, path_, ": fsync of '", tmp_, "' failed: ", errno_text());
  const int fd = fd_;
  fd_ = -1;
  OT_CHECK(::close(fd) == 0, path_, ": close of '", tmp_, "' failed: ", errno_text());
  OT_CHECK(::rename(tmp_.c_str(), target_.c_str()) == 0, path_, ": cannot replace the file: ",
           errno_text());
  committed_ = true;
  fs::path dir = fs::path(target_).parent_path();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {  // the new entry's durability; the content is already in place
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file(const std::string& path, std::string_view bytes) {
  OutputFile f(path);
  f.write(bytes);
  f.commit();
}

namespace {

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  std::error_code ea, eb;
  const fs::path ca = fs::weakly_canonical(fs::absolute(a), ea);
  const fs::path cb = fs::weakly_canonical(fs::absolute(b), eb);
  return !ea && !eb && ca == cb;
}

}  // namespace

void check_distinct_files(const std::vector<FileRole>& inputs,
                          const std::vector<FileRole>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const FileRole& out = outputs[i];
    if (out.path.empty()) continue;
    for (const FileRole& in : inputs)
      OT_CHECK(in.path.empty() || !same_file(out.path, in.path), out.what, " '", out.path,
               "' is ", in.what, " ('", in.path, "'): writing it would destroy an input; choose "
               "another file");
    for (size_t j = 0; j < i; ++j)
      OT_CHECK(outputs[j].path.empty() || !same_file(out.path, outputs[j].path), out.what, " '",
               out.path, "' and ", outputs[j].what, " '", outputs[j].path,
               "' are the same file; give each its own");
  }
}

void check_writable(const FileRole& out) {
  if (out.path.empty()) return;
  struct stat st {};
  const bool exists = ::stat(out.path.c_str(), &st) == 0;
  OT_CHECK(!exists || !S_ISDIR(st.st_mode), out.what, " '", out.path,
           "' is a directory; give a file name");
  if (exists && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) return;  // written in place
  fs::path dir = fs::absolute(out.path).parent_path();
  std::error_code ec;
  OT_CHECK(fs::is_directory(dir, ec), out.what, " '", out.path, "': folder '", dir.string(),
           "' does not exist");
  const std::string probe = (dir / (".onnxtrain-write-test." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  OT_CHECK(fd >= 0, out.what, " '", out.path, "': cannot create files in '", dir.string(),
           "' (", errno_text(), ")");
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace onnxtrain::graph
