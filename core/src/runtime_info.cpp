#include <hasten/runtime_info.hpp>
#include <hasten/version.hpp>

#include <dlfcn.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "host_api.hpp"

namespace hasten {

namespace {

// Makes sure LibTorch's BLAS is mapped (it is loaded with libtorch_cpu) and lists the BLAS
// libraries in this process's address space.
std::set<std::string> mapped_blas_libraries() {
  std::set<std::string> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string base = std::filesystem::path(path).filename().string();
    if (base.find("blas") != std::string::npos) out.insert(path);
  }
  return out;
}

}  // namespace

std::string BlasInfo::summary() const {
  std::ostringstream s;
  s << library;
  if (library == "openblas") {
    s << " (core " << (core.empty() ? "?" : core) << ", " << threads << " thread"
      << (threads == 1 ? "" : "s") << ")";
    if (!config.empty()) s << " [" << config << "]";
  } else if (!path.empty()) {
    s << " (" << path << ")";
  }
  return s.str();
}

BlasInfo blas_info() {
  BlasInfo info;
  for (const auto& path : mapped_blas_libraries()) {
    const std::string base = std::filesystem::path(path).filename().string();
    if (base.find("openblas") != std::string::npos) {
      info.library = "openblas";
      info.path = path;
      if (void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
        using str_fn = char* (*)();
        using int_fn = int (*)();
        if (auto f = reinterpret_cast<str_fn>(::dlsym(h, "openblas_get_corename"))) info.core = f();
        if (auto f = reinterpret_cast<str_fn>(::dlsym(h, "openblas_get_config"))) info.config = f();
        if (auto f = reinterpret_cast<int_fn>(::dlsym(h, "openblas_get_num_threads"))) info.threads = f();
        ::dlclose(h);
      }
      return info;
    }
  }
  for (const auto& path : mapped_blas_libraries()) {
    const std::string real = std::filesystem::weakly_canonical(path).string();
    info.path = real;
    if (real.find("/blas/") != std::string::npos) info.library = "netlib-reference";
  }
  return info;
}

RuntimeInfo runtime_info() {
  RuntimeInfo r;
  r.hasten_version = version();
  r.torch_version = TORCH_VERSION;
  r.torch_fingerprint = detail::host_torch_fingerprint();
#if defined(__clang__)
  r.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  r.compiler = "g++ " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__) + "." +
               std::to_string(__GNUC_PATCHLEVEL__);
#else
  r.compiler = "unknown";
#endif
  r.cuda_available = torch::cuda::is_available();
  r.cuda_devices = r.cuda_available ? static_cast<int>(torch::cuda::device_count()) : 0;
  r.blas = blas_info();
  return r;
}

}  // namespace hasten
