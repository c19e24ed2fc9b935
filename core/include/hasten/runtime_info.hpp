// Facts about the running process that users report with bugs and benchmarks record:
// versions, the BLAS library and kernel in use, GPU availability.
#pragma once

#include <string>

namespace hasten {

struct BlasInfo {
  std::string library = "unknown";  // "openblas", "netlib-reference", "unknown"
  std::string path;                 // the library file mapped into the process
  std::string core;                 // OpenBLAS's kernel family ("Haswell", "SkylakeX", ...)
  std::string config;               // OpenBLAS's build configuration string
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

}  // namespace hasten
