// Custom-op libraries: load_op_library dlopens a plugin (built against ops/plugin_api.h),
// checks its op API version and registers its ops into OpRegistry::global().
#pragma once

#include <string>
#include <vector>

namespace onnxtrain::ops {

struct LoadedOpLibrary {
  std::string path;              // canonical path of the file
  std::string name;              // the name the library gives itself (OpLibraryInfo::name)
  std::vector<std::string> ops;  // what it registered: "my.ops.ScaledTanh (opset 1+)", ...
  bool already_loaded = false;   // true when this call found the file loaded before
};

// Loads the custom-op library at `path` (a file path; relative paths are taken from the
// current folder, never searched on LD_LIBRARY_PATH) and registers its ops. All or nothing:
// when any op fails to register or clashes with a built-in op or with another library's op,
// none is registered and the library is closed again. The same file loaded twice (by any
// path) is a no-op that returns the first load's record. Throws onnxtrain::Error with a
// one-line message naming `path` when the file cannot be opened (with dlerror's reason), has
// no entry point, was built against another kOpApiVersion, or its register function fails.
// Loaded libraries stay loaded for the life of the process (their kernels are in the
// registry). Call it before creating sessions: the registry is not locked against readers.
LoadedOpLibrary load_op_library(const std::string& path);

// Every library loaded so far, in load order.
std::vector<LoadedOpLibrary> loaded_op_libraries();

}  // namespace onnxtrain::ops
