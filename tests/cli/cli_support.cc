// Process spawning and a strict JSON checker for the CLI tests.
#include "tests/cli/cli_support.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace onnxtrain::cli_test {
namespace {

namespace fs = std::filesystem;

// Recursive descent over RFC 8259, so the tests do not depend on python being present.
class JsonChecker {
 public:
  explicit JsonChecker(std::string_view s) : s_(s) {}

  bool valid(std::string* why) {
    try {
      skip_ws();
      value(0);
      skip_ws();
      if (i_ != s_.size()) fail("trailing characters");
      return true;
    } catch (const std::runtime_error& e) {
      *why = e.what();
      return false;
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw std::runtime_error(what + " at offset " + std::to_string(i_));
  }
  char peek() { return i_ < s_.size() ? s_[i_] : '\0'; }
  char next() {
    if (i_ >= s_.size()) fail("unexpected end");
    return s_[i_++];
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t'))
      ++i_;
  }
  void expect(char c) {
    if (next() != c) fail(std::string("expected '") + c + "'");
  }
  void literal(std::string_view word) {
    for (char c : word) expect(c);
  }
  void value(int depth) {
    if (depth > 200) fail("nesting too deep");
    switch (peek()) {
      case '{':
        object(depth);
        break;
      case '[':
        array(depth);
        break;
      case '"':
        string();
        break;
      case 't':
        literal("true");
        break;
      case 'f':
        literal("false");
        break;
      case 'n':
        literal("null");
        break;
      default:
        number();
    }
  }
  void object(int depth) {
    expect('{');
    skip_ws();
    if (peek() == '}') return void(++i_);
    for (;;) {
      skip_ws();
      string();
      skip_ws();
      expect(':');
      skip_ws();
      value(depth + 1);
      skip_ws();
      char c = next();
      if (c == '}') return;
      if (c != ',') fail("expected ',' or '}'");
    }
  }
  void array(int depth) {
    expect('[');
    skip_ws();
    if (peek() == ']') return void(++i_);
    for (;;) {
      skip_ws();
      value(depth + 1);
      skip_ws();
      char c = next();
      if (c == ']') return;
      if (c != ',') fail("expected ',' or ']'");
    }
  }
  void string() {
    expect('"');
    for (;;) {
      auto c = static_cast<unsigned char>(next());
      if (c == '"') return;
      if (c == '\\') {
        char e = next();
        if (e == 'u') {
          for (int k = 0; k < 4; ++k)
            if (!std::isxdigit(static_cast<unsigned char>(next()))) fail("bad \\u escape");
        } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
          fail("bad escape");
        }
      } else if (c < 0x20) {
        fail("raw control character in string");
      } else if (c >= 0x80) {
        int extra = c >= 0xF0 && c <= 0xF4 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 && c < 0xE0 ? 1 : -1;
        if (extra < 0 || c > 0xF4) fail("invalid UTF-8 lead byte");
        for (int k = 0; k < extra; ++k)
          if ((static_cast<unsigned char>(next()) & 0xC0) != 0x80) fail("invalid UTF-8");
      }
    }
  }
  void number() {
    if (peek() == '-') ++i_;
    if (peek() == '0') {
      ++i_;
    } else if (std::isdigit(static_cast<unsigned char>(peek()))) {
      while (std::isdigit(static_cast<unsigned char>(peek()))) ++i_;
    } else {
      fail("unexpected character");
    }
    if (peek() == '.') {
      ++i_;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("bad fraction");
      while (std::isdigit(static_cast<unsigned char>(peek()))) ++i_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("bad exponent");
      while (std::isdigit(static_cast<unsigned char>(peek()))) ++i_;
    }
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

std::filesystem::path fresh_test_dir(const std::string& prefix) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      (prefix + (info ? info->name() : "none") + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

RunResult run_process(const std::vector<std::string>& args, const fs::path& dir,
                      const std::string& stdin_path) {
  fs::path out_path = dir / "stdout.txt", err_path = dir / "stderr.txt";
  std::string in_path = stdin_path.empty() ? "/dev/null" : stdin_path;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, in_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  RunResult r;
  if (rc != 0) {
    r.err = "spawn failed: " + std::string(std::strerror(rc));
    return r;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

bool on_path(const std::string& tool) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && access((fs::path(dir) / tool).c_str(), X_OK) == 0) return true;
  return false;
}

bool python_available() {
  static const bool ok = [] {
    if (!on_path("python3")) return false;
    fs::path tmp = fs::temp_directory_path();
    return run_process({"python3", "-c", "import json"}, tmp).rc == 0;
  }();
  return ok;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string line;
  while (std::getline(ss, line)) out.push_back(line);
  return out;
}

bool has_line_matching(const std::string& text, const std::string& pattern) {
  std::regex re(pattern);
  for (const auto& l : lines_of(text))
    if (std::regex_match(l, re)) return true;
  return false;
}

bool is_valid_json(std::string_view doc, std::string* why) {
  return JsonChecker(doc).valid(why);
}

}  // namespace onnxtrain::cli_test
