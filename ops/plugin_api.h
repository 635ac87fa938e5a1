// The entry point of a custom-op library: the one extern "C" symbol ops::load_op_library
// (ops/plugin.h) looks up. A plugin defines it with ONNXTRAIN_OP_LIBRARY(name, register_fn).
#pragma once

#include <exception>
#include <string>

#include "ops/op_api.h"

namespace onnxtrain::ops {

// What the entry point returns. `api_version` stays the first member in every version of this
// struct: the loader reads it before it trusts anything else the library hands over.
struct OpLibraryInfo {
  int api_version;       // kOpApiVersion the library was compiled against
  unsigned schema_size;  // sizeof(OpSchema) there: a different compiler or standard library
                         // shows up here even when the API version matches
  const char* name;      // shown in messages, e.g. "scaled_tanh example ops"
  // Adds the library's ops to `registry`, a staging registry: the loader moves them into
  // OpRegistry::global() only when every one registered and none clashes. Returns nullptr on
  // success, else an error message (valid until the next call).
  const char* (*register_ops)(OpRegistry* registry);
};

// The symbol the loader looks up, and its type.
inline constexpr const char* kOpLibraryEntryPoint = "onnxtrain_op_library";
using OpLibraryEntryFn = const OpLibraryInfo* (*)();

namespace detail {
// Runs a plugin's register function, turning an exception into the message the loader reports
// (exceptions are not thrown across the library boundary).
inline const char* call_register(void (*fn)(OpRegistry&), OpRegistry* registry,
                                 std::string& error) noexcept {
  try {
    fn(*registry);
    return nullptr;
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "an exception that is not a std::exception";
  }
  return error.c_str();
}
}  // namespace detail

}  // namespace onnxtrain::ops

// Defines the entry point of a custom-op library. `register_fn` is a function
// `void register_fn(onnxtrain::ops::OpRegistry& registry)` that calls registry.add(...) once per
// op (forward ops and their grad ops alike). Use it once per library, at namespace scope:
//     ONNXTRAIN_OP_LIBRARY("my ops", register_my_ops)
#define ONNXTRAIN_OP_LIBRARY(lib_name, register_fn)                                          \
  static const char* onnxtrain_op_library_register(::onnxtrain::ops::OpRegistry* registry) { \
    static std::string error;                                                                \
    return ::onnxtrain::ops::detail::call_register(&(register_fn), registry, error);         \
  }                                                                                          \
  extern "C" __attribute__((visibility("default"))) const ::onnxtrain::ops::OpLibraryInfo*   \
  onnxtrain_op_library() {                                                                   \
    static const ::onnxtrain::ops::OpLibraryInfo info{                                       \
        ::onnxtrain::ops::kOpApiVersion,                                                     \
        static_cast<unsigned>(sizeof(::onnxtrain::ops::OpSchema)), (lib_name),               \
        &onnxtrain_op_library_register};                                                     \
    return &info;                                                                            \
  }
