// Helpers for tests that run the built command-line tools: spawn a binary with captured
// output, look for tools on PATH, and check that a document is strict JSON.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace onnxtrain::cli_test {

struct RunResult {
  int rc = -1;  // exit status, or 128 + signal number when the process was killed
  std::string out;
  std::string err;
};

// Runs args[0] (searched on PATH when it has no '/') with stdout and stderr captured in files
// under `dir`; stdin comes from `stdin_path`, or /dev/null when it is empty.
RunResult run_process(const std::vector<std::string>& args, const std::filesystem::path& dir,
                      const std::string& stdin_path = "");

// A fresh, empty folder for the running gtest test: <tmp>/<prefix><test name>_<pid>.
std::filesystem::path fresh_test_dir(const std::string& prefix);

std::string read_file(const std::filesystem::path& p);
bool on_path(const std::string& tool);
// python3 is on PATH and runs (checks may use json.load on the tool's output).
bool python_available();

std::vector<std::string> lines_of(const std::string& s);
// Some line of `text` matches `pattern` (std::regex, whole line).
bool has_line_matching(const std::string& text, const std::string& pattern);

// RFC 8259 syntax plus well-formed UTF-8 in strings; on failure *why says what and where.
bool is_valid_json(std::string_view doc, std::string* why);

}  // namespace onnxtrain::cli_test
