// DLTensor buffer helpers shared by the CPU comm plugins (C tier).
#pragma once

#include <hasten/plugin.hpp>

#include <string>

namespace hasten::comm {

inline size_t elements(const DLTensor& t) {
  size_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= static_cast<size_t>(t.shape[i]);
  return n;
}

inline size_t element_size(const DLTensor& t) { return (t.dtype.bits * t.dtype.lanes + 7) / 8; }

inline char* data_of(const DLTensor& t) { return static_cast<char*>(t.data) + t.byte_offset; }

// CPU buffers laid out compactly (strides NULL or row-major); anything else is refused.
inline void require_cpu_compact(const DLTensor& t, const char* plugin, const char* op) {
  if (t.device.device_type != kDLCPU)
    throw sdk::Error(HASTEN_ERR_UNSUPPORTED, std::string(plugin) + " " + op + ": only CPU buffers (got device type " +
                                                 std::to_string(t.device.device_type) + ")");
  if (t.strides != nullptr) {
    int64_t expected = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expected)
        throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT, std::string(plugin) + " " + op + ": buffers must be contiguous");
      expected *= t.shape[i];
    }
  }
}

}  // namespace hasten::comm
