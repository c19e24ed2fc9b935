// Facts about the running process that users report with bugs and benchmarks record:
// versions, the BLAS library and kernel in use, GPU availability.
#pragma once

#include <string>
#include <vector>

namespace hasten {

struct BlasInfo {
  std::string library = "unknown";  // "mkl", "openblas", "netlib-reference", "unknown"
  std::string path;                 // the library file mapped into the process (MKL: libtorch_cpu)
  std::string core;                 // OpenBLAS's kernel family ("Haswell", "SkylakeX", ...)
  std::string config;               // OpenBLAS's build configuration string; MKL's version
  int threads = 0;
  std::string summary() const;      // "openblas 0.3.21 (core SkylakeX, 1 thread)"
};

struct RuntimeInfo {
  std::string hasten_version;
  std::string torch_version;
  std::string torch_fingerprint;
  std::string compiler;
  bool cuda_available = false;
  int cuda_devices = 0;
  BlasInfo blas;
};

BlasInfo blas_info();
RuntimeInfo runtime_info();

// Sizes the BLAS's thread pool: the pool's size decides how a product is split, and so its
// rounding, so two runs compare bit for bit only with the same size on both sides. MKL (PyTorch's
// wheels): LibTorch's intra-op pool, which sizes MKL's (at::set_num_threads). A loaded OpenBLAS:
// its own pool, which LibTorch's set_num_threads does not reach (Debian's pthread build runs one
// thread per core, or OPENBLAS_NUM_THREADS as read at load). Returns false for any other BLAS.
bool set_blas_threads(int threads);

// OpenBLAS 0.3.21 does not recognise some (often virtualised) CPUs and falls back to old
// SSE kernels, several times slower than what the CPU can run. Given the kernel OpenBLAS
// picked and the CPU's feature flags (/proc/cpuinfo), the kernel to force with
// OPENBLAS_CORETYPE, or "" when OpenBLAS's own choice is already the best family.
struct BlasAdvice {
  std::string coretype;  // "" when nothing should change
  std::string reason;
};
BlasAdvice openblas_coretype_advice(const std::string& detected_core, const std::vector<std::string>& cpu_flags);
// For this process: the loaded OpenBLAS's kernel and this CPU's flags.
BlasAdvice openblas_coretype_advice();

}  // namespace hasten
