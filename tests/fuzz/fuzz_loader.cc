// libFuzzer target for the ONNX loader: any input must load or throw onnxtrain::Error; a crash,
// a sanitizer report or any other exception is a finding. Loaded models must also round-trip.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <ostream>
#include <streambuf>
#include <string>
#include <string_view>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/printer.h"

namespace {

// Discards everything, so print_model runs in full without producing output.
class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

[[noreturn]] void finding(const char* stage, const char* what) {
  std::fprintf(stderr, "fuzz_loader: %s threw a non-onnxtrain exception: %s\n", stage, what);
  std::abort();
}

void check_loaded(const onnxtrain::graph::Model& m) {
  using namespace onnxtrain::graph;
  NullBuffer buf;
  std::ostream null_out(&buf);
  print_model(null_out, m);
  std::string bytes = export_onnx_bytes(m);
  // What the exporter wrote from a verified model must load again.
  auto again = import_onnx_bytes(bytes, "fuzz-roundtrip.onnx", "");
  print_model(null_out, *again);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<onnxtrain::graph::Model> m;
  try {
    m = onnxtrain::graph::import_onnx_bytes(bytes, "fuzz.onnx", "" /* no external data */);
  } catch (const onnxtrain::Error&) {
    return 0;  // a clean refusal
  } catch (const std::exception& e) {
    finding("import", e.what());
  }
  try {
    check_loaded(*m);
  } catch (const onnxtrain::Error& e) {
    // The model loaded and verified, so printing, export and re-import must not fail.
    std::fprintf(stderr, "fuzz_loader: round trip of a loaded model failed: %s\n", e.what());
    std::abort();
  } catch (const std::exception& e) {
    finding("round trip", e.what());
  }
  return 0;
}
