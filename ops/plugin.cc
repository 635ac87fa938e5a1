// load_op_library (plugin.h): dlopen, entry point and version check, staged registration.
#include "ops/plugin.h"

#include <dlfcn.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "graph/error.h"
#include "ops/op_api.h"
#include "ops/plugin_api.h"

namespace onnxtrain::ops {
namespace {

namespace fs = std::filesystem;

struct Library {
  LoadedOpLibrary record;
  void* handle = nullptr;  // never closed: the registry holds the library's kernels
};

std::mutex& libraries_mutex() {
  static std::mutex m;
  return m;
}
std::vector<Library>& libraries() {
  static std::vector<Library> libs;
  return libs;
}
// Which library registered a schema of the global registry (built-ins are absent).
std::map<const OpSchema*, std::string>& schema_owner() {
  static std::map<const OpSchema*, std::string> owners;
  return owners;
}

std::string normalized_domain(const std::string& d) {
  return d == "ai.onnx" ? "" : d;
}

std::string op_text(const OpSchema& s) {
  const std::string domain = normalized_domain(s.domain);
  const std::string range = s.until_version >= (1 << 30)
                                ? cat(s.since_version, "+")
                                : cat(s.since_version, "..", s.until_version);
  return cat(domain.empty() ? "" : domain + ".", s.op_type, " (opset ", range, ")");
}

// A registration of the global registry that `s` overlaps: same (domain, op_type), opset
// ranges intersecting.
const OpSchema* overlapping(const OpSchema& s) {
  for (const OpSchema* g : OpRegistry::global().all())
    if (normalized_domain(g->domain) == normalized_domain(s.domain) && g->op_type == s.op_type &&
        g->since_version <= s.until_version && s.since_version <= g->until_version)
      return g;
  return nullptr;
}

// dlclose on scope exit unless released: a library that registered nothing is closed again.
class HandleGuard {
 public:
  explicit HandleGuard(void* h) : h_(h) {}
  HandleGuard(const HandleGuard&) = delete;
  HandleGuard& operator=(const HandleGuard&) = delete;
  ~HandleGuard() {
    if (h_) dlclose(h_);
  }
  void* release() {
    void* h = h_;
    h_ = nullptr;
    return h;
  }

 private:
  void* h_;
};

const OpLibraryInfo* library_info(void* handle, const std::string& path) {
  dlerror();
  void* sym = dlsym(handle, kOpLibraryEntryPoint);
  OT_CHECK(sym, "custom-op library ", path, ": no entry point '", kOpLibraryEntryPoint,
           "' (define it with ONNXTRAIN_OP_LIBRARY from ops/plugin_api.h)");
  // POSIX guarantees that a function's address survives the round trip through void*.
  auto entry = reinterpret_cast<OpLibraryEntryFn>(sym);
  const OpLibraryInfo* info = entry();
  OT_CHECK(info, "custom-op library ", path, ": ", kOpLibraryEntryPoint, "() returned null");
  OT_CHECK(info->api_version == kOpApiVersion, "custom-op library ", path,
           ": built against op API ", info->api_version, ", this onnxtrain has ", kOpApiVersion,
           " (rebuild it against this onnxtrain's ops/op_api.h)");
  OT_CHECK(info->schema_size == sizeof(OpSchema), "custom-op library ", path, ": OpSchema is ",
           info->schema_size, " bytes there and ", sizeof(OpSchema),
           " here (built with another compiler or standard library?)");
  OT_CHECK(info->register_ops, "custom-op library ", path, ": no register function");
  return info;
}

// Runs the library's register function into a staging registry and checks each op; returns
// copies of the schemas (the staging registry dies before the library may be closed).
std::vector<OpSchema> staged_ops(const OpLibraryInfo& info, const std::string& path) {
  OpRegistry staging;
  const char* error = info.register_ops(&staging);
  if (error) fail("custom-op library ", path, ": registering its ops failed: ", std::string(error));
  std::vector<OpSchema> out;
  for (const OpSchema* s : staging.all()) {
    OT_CHECK(s->infer, "custom-op library ", path, ": ", op_text(*s),
             " has no type/shape inference (OpSchema::infer)");
    OT_CHECK(s->cpu_kernel || s->cuda_kernel, "custom-op library ", path, ": ", op_text(*s),
             " has no kernel");
    if (const OpSchema* clash = overlapping(*s)) {
      auto owner = schema_owner().find(clash);
      fail("custom-op library ", path, ": ", op_text(*s), " clashes with ",
           owner == schema_owner().end()
               ? "the built-in " + op_text(*clash)
               : op_text(*clash) + " of custom-op library " + owner->second);
    }
    out.push_back(*s);
  }
  OT_CHECK(!out.empty(), "custom-op library ", path, ": registered no ops");
  return out;
}

}  // namespace

LoadedOpLibrary load_op_library(const std::string& path) {
  OT_CHECK(!path.empty(), "custom-op library: empty path");
  std::error_code ec;
  const bool exists = fs::is_regular_file(path, ec);
  OT_CHECK(exists, "custom-op library ", path,
           ": cannot be opened: ", ec ? ec.message() : "no such file");
  const std::string canonical = fs::canonical(path, ec).string();
  OT_CHECK(!ec, "custom-op library ", path, ": cannot be opened: ", ec.message());

  std::lock_guard<std::mutex> lock(libraries_mutex());
  for (const Library& lib : libraries())
    if (lib.record.path == canonical) {
      LoadedOpLibrary r = lib.record;
      r.already_loaded = true;
      return r;
    }
  const size_t registered_before = OpRegistry::global().all().size();
  dlerror();
  void* handle = dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    fail("custom-op library ", path, ": cannot be opened: ", why ? why : "dlopen failed");
  }
  HandleGuard guard(handle);
  // Static registrars (ONNXTRAIN_REGISTER_OP) ran inside dlopen, unchecked. Their schemas now
  // point into the library, so it must stay loaded; the error says how to register instead.
  const size_t at_load = OpRegistry::global().all().size() - registered_before;
  if (at_load > 0) {
    guard.release();
    fail("custom-op library ", path, ": registered ", at_load,
         " op(s) while loading, with ONNXTRAIN_REGISTER_OP (that is for built-in ops; a plugin "
         "registers through ONNXTRAIN_OP_LIBRARY so the loader can check its ops)");
  }
  // The same file by another name (a hard link): dlopen hands back the loaded handle.
  for (const Library& lib : libraries())
    if (lib.handle == handle) {
      LoadedOpLibrary r = lib.record;
      r.already_loaded = true;
      return r;
    }

  const OpLibraryInfo* info = library_info(handle, path);
  std::vector<OpSchema> ops = staged_ops(*info, path);

  Library lib;
  lib.record.path = canonical;
  lib.record.name = info->name ? info->name : "";
  // From the first add on, the registry holds the library's code: never close it again.
  lib.handle = guard.release();
  OpRegistry& global = OpRegistry::global();
  for (OpSchema& s : ops) {
    const std::string text = op_text(s);
    const std::string domain = s.domain;
    const std::string op_type = s.op_type;
    const int since = s.since_version;
    global.add(std::move(s));  // cannot clash: staged_ops checked every op
    schema_owner()[global.find(domain, op_type, since)] = canonical;
    lib.record.ops.push_back(text);
  }
  libraries().push_back(lib);
  return lib.record;
}

std::vector<LoadedOpLibrary> loaded_op_libraries() {
  std::lock_guard<std::mutex> lock(libraries_mutex());
  std::vector<LoadedOpLibrary> out;
  for (const Library& lib : libraries()) out.push_back(lib.record);
  return out;
}

}  // namespace onnxtrain::ops
