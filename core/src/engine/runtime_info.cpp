#include <hasten/runtime_info.hpp>
#include <hasten/version.hpp>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/cuda.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "plugins/host_api.hpp"

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
  if (library == "mkl") {
    s << " " << config << " (" << threads << " thread" << (threads == 1 ? "" : "s") << ", linked into "
      << std::filesystem::path(path).filename().string() << ")";
  } else if (library == "openblas") {
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
  // PyTorch's x86-64 wheels link MKL statically into libtorch_cpu: no library of its own is
  // mapped, LibTorch says it has it, and its thread count is LibTorch's intra-op one.
  if (at::hasMKL()) {
    info.library = "mkl";
    info.threads = at::get_num_threads();
    Dl_info where{};
    // at::hasMKL is inline; globalContext is defined in libtorch_cpu, where MKL is linked.
    if (::dladdr(reinterpret_cast<void*>(&at::globalContext), &where) != 0 && where.dli_fname != nullptr)
      info.path = where.dli_fname;
    const std::string config = at::show_config();
    const std::string tag = "Math Kernel Library Version ";
    if (auto at = config.find(tag); at != std::string::npos) {
      const auto begin = at + tag.size();
      info.config = config.substr(begin, config.find_first_of(" -\n", begin) - begin);
    }
    return info;
  }
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

bool set_blas_threads(int threads) {
  if (at::hasMKL()) {  // LibTorch sizes MKL's pool with its own (mkl_set_num_threads)
    at::set_num_threads(std::max(1, threads));
    return true;
  }
  for (const auto& path : mapped_blas_libraries()) {
    if (std::filesystem::path(path).filename().string().find("openblas") == std::string::npos) continue;
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) continue;
    using set_fn = void (*)(int);
    auto f = reinterpret_cast<set_fn>(::dlsym(h, "openblas_set_num_threads"));
    if (f != nullptr) f(std::max(1, threads));
    ::dlclose(h);
    if (f != nullptr) return true;
  }
  return false;
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

namespace {

int family_rank(const std::string& core) {
  static const std::vector<std::pair<std::string, int>> ranks = {
      {"sapphirerapids", 3}, {"cooperlake", 3}, {"skylakex", 3}, {"zen", 2},   {"haswell", 2},
      {"skylake", 2},        {"sandybridge", 1}, {"bulldozer", 1}, {"piledriver", 1}, {"steamroller", 1},
      {"excavator", 1}};
  std::string l;
  for (char c : core) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (auto& [name, rank] : ranks)
    if (l == name) return rank;
  return 0;  // Prescott, Core2, Nehalem, Atom, Barcelona...: SSE kernels
}

}  // namespace

BlasAdvice openblas_coretype_advice(const std::string& detected_core, const std::vector<std::string>& flags) {
  auto has = [&](const char* f) { return std::find(flags.begin(), flags.end(), f) != flags.end(); };
  std::string best;
  int best_rank = 0;
  if (has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq") && has("avx512cd")) {
    best = has("avx512_bf16") ? "Cooperlake" : "SkylakeX";
    best_rank = 3;
  } else if (has("avx2") && has("fma")) {
    best = "Haswell";
    best_rank = 2;
  } else if (has("avx")) {
    best = "Sandybridge";
    best_rank = 1;
  }
  BlasAdvice advice;
  if (detected_core.empty() || best.empty() || family_rank(detected_core) >= best_rank) return advice;
  advice.coretype = best;
  advice.reason = "OpenBLAS picked " + detected_core + " kernels, but this CPU supports " + best +
                  "'s (it does not recognise the CPU)";
  return advice;
}

BlasAdvice openblas_coretype_advice() {
  const BlasInfo blas = blas_info();
  if (blas.library != "openblas") return {};
  std::vector<std::string> flags;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string w; words >> w;) flags.push_back(w);
    break;
  }
  return openblas_coretype_advice(blas.core, flags);
}

}  // namespace hasten
