// DLTensor buffer helpers shared by the comm plugins (C tier): CPU (shm, gloo) and CUDA (nccl).
// Nothing here calls a device runtime, so the checks run, and are tested, without a GPU.
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

// True when t's elements are dense and row-major: strides NULL (DLPack's "compact"), or equal
// to the compact strides wherever the extent is not 1 (a stride along an extent of 1 is never
// used, and LibTorch gives such dimensions arbitrary strides).
inline bool is_compact(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

// "[4, 3]" for the n values at v ("NULL" when v is).
inline std::string list_of(const int64_t* v, int32_t n) {
  if (v == nullptr) return "NULL";
  std::string s = "[";
  for (int32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The compact strides of t's shape, as list_of prints them.
inline std::string compact_strides_of(const DLTensor& t) {
  std::string s;
  int64_t stride = 1;
  for (int32_t i = t.ndim - 1; i >= 0; --i) {
    s = std::to_string(stride) + (s.empty() ? "" : ", ") + s;
    stride *= t.shape[i];
  }
  return "[" + s + "]";
}

// "CPU", "CUDA"... for a DLDeviceType, with its number.
inline std::string device_type_name(int32_t type) {
  const char* name = type == kDLCPU             ? "CPU"
                     : type == kDLCUDA          ? "CUDA"
                     : type == kDLCUDAHost      ? "CUDA host (pinned)"
                     : type == kDLCUDAManaged   ? "CUDA managed"
                     : type == kDLROCM          ? "ROCm"
                     : type == kDLROCMHost      ? "ROCm host"
                                                : "unknown";
  return std::string(name) + " (device type " + std::to_string(type) + ")";
}

// CPU buffers laid out compactly (strides NULL or row-major); anything else is refused.
inline void require_cpu_compact(const DLTensor& t, const char* plugin, const char* op) {
  if (t.device.device_type != kDLCPU)
    throw sdk::Error(HASTEN_ERR_UNSUPPORTED, std::string(plugin) + " " + op + ": only CPU buffers (got device type " +
                                                 std::to_string(t.device.device_type) + ")");
  if (!is_compact(t))
    throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT, std::string(plugin) + " " + op + ": buffers must be contiguous");
}

// CUDA buffers on the communicator's device (device_id, -1 before the communicator has one),
// laid out compactly (strides NULL or row-major; byte_offset is honoured by data_of). Each
// refusal is one line naming the operation, what was given and what is allowed. The checks
// read only the DLTensor struct: no CUDA call, so they run before any (and without a GPU).
inline void require_cuda_compact(const DLTensor& t, int32_t device_id, const char* plugin, const char* op) {
  const std::string what = std::string(plugin) + " " + op + ": ";
  const std::string allowed = device_id >= 0 ? "cuda:" + std::to_string(device_id) : std::string("this rank's GPU");
  if (t.device.device_type != kDLCUDA)
    throw sdk::Error(HASTEN_ERR_UNSUPPORTED, what + "only CUDA buffers on " + allowed + " (got a buffer on " +
                                                 device_type_name(t.device.device_type) + ")");
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr))
    throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT, what + "the buffer has no shape (ndim " + std::to_string(t.ndim) + ")");
  for (int32_t i = 0; i < t.ndim; ++i)
    if (t.shape[i] < 0)
      throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT,
                       what + "the buffer's shape " + list_of(t.shape, t.ndim) + " has a negative extent");
  if (!is_compact(t))
    throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT, what + "only dense row-major buffers (got shape " +
                                                      list_of(t.shape, t.ndim) + " with strides " +
                                                      list_of(t.strides, t.ndim) + "; allowed: strides NULL or " +
                                                      compact_strides_of(t) + ")");
  if (t.device.device_id != device_id)
    throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT,
                     what + "the buffer is on cuda:" + std::to_string(t.device.device_id) +
                         (device_id >= 0 ? ", but this rank's communicator is on " + allowed + " (only buffers on " +
                                               allowed + " are allowed)"
                                         : ", but this communicator has no device yet (init has not completed)"));
  if (t.data == nullptr && elements(t) > 0)
    throw sdk::Error(HASTEN_ERR_INVALID_ARGUMENT, what + "the buffer's data is NULL");
}

}  // namespace hasten::comm
