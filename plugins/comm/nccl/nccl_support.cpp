// NCCL and CUDA errors, versions and types as the plugin reports and maps them
// (nccl_support.hpp).
#include "nccl_support.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace hasten::nccl {

using hasten::sdk::Error;

// op: the operation for the message ("allreduce"), or NULL.
void cuda_check(cudaError_t e, const char* what, const char* op) {
  if (e != cudaSuccess)
    throw Error(HASTEN_ERR_SYSTEM, std::string("nccl") + (op ? std::string(" ") + op : std::string()) + ": " + what +
                                       ": " + cudaGetErrorString(e));
}

hasten_status status_of(ncclResult_t r) {
  return r == ncclRemoteError || r == ncclSystemError          ? HASTEN_ERR_REMOTE
         : static_cast<int>(r) == 8 /* ncclTimeout (newer nccl.h) */ ? HASTEN_ERR_TIMEOUT
         : r == ncclInvalidArgument || r == ncclInvalidUsage   ? HASTEN_ERR_INVALID_ARGUMENT
                                                               : HASTEN_ERR_INTERNAL;
}

// NCCL's own words for r, with its last error message when it has one.
std::string nccl_text(ncclResult_t r) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') s += std::string(" (") + last + ")";
  return s;
}

// ncclInProgress is not a failure: the caller settles it (NcclComm::settle).
void nccl_check(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  throw Error(status_of(r), "nccl: " + what + ": " + nccl_text(r));
}

NcclVersion checked_nccl_version() {
  int code = 0;
  nccl_check(ncclGetVersion(&code), "ncclGetVersion");
  const NcclVersion runtime(code), built(NCCL_VERSION_CODE);
  if (runtime.major != built.major || runtime.minor != built.minor)
    throw Error(HASTEN_ERR_UNSUPPORTED,
                "nccl: the plugin was compiled against NCCL " + built.text() + " (nccl.h) but this process runs NCCL " +
                    runtime.text() + " (the libnccl.so.2 loaded first, normally LibTorch's); rebuild the plugin "
                                     "against the nccl.h that comes with that library");
  return runtime;
}

std::string visible_devices_note() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v != nullptr ? std::string(" (CUDA_VISIBLE_DEVICES=") + v + ")" : std::string();
}

std::string seconds(int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(ms) / 1000.0);
  return buf;
}

ncclDataType_t nccl_type(const DLDataType& d) {
  if (d.lanes == 1) {
    if (d.code == kDLFloat && d.bits == 32) return ncclFloat32;
    if (d.code == kDLFloat && d.bits == 64) return ncclFloat64;
    if (d.code == kDLFloat && d.bits == 16) return ncclFloat16;
    if (d.code == kDLBfloat && d.bits == 16) return ncclBfloat16;
    if (d.code == kDLInt && d.bits == 64) return ncclInt64;
    if (d.code == kDLInt && d.bits == 32) return ncclInt32;
    if (d.code == kDLUInt && d.bits == 8) return ncclUint8;
    if (d.code == kDLInt && d.bits == 8) return ncclInt8;
  }
  throw Error(HASTEN_ERR_UNSUPPORTED, "nccl: unsupported dtype (code " + std::to_string(d.code) + ", " +
                                          std::to_string(d.bits) + " bits)");
}

ncclRedOp_t nccl_op(hasten_reduce_op op) {
  switch (op) {
    case HASTEN_REDUCE_SUM: return ncclSum;
    case HASTEN_REDUCE_AVG: return ncclAvg;
    case HASTEN_REDUCE_MIN: return ncclMin;
    case HASTEN_REDUCE_MAX: return ncclMax;
  }
  throw Error(HASTEN_ERR_INVALID_ARGUMENT, "nccl: unknown reduce op " + std::to_string(static_cast<int>(op)));
}

// The per-call options, read as the ABI says: min(struct_size, our size) bytes into zeroed
// storage, so that fields the writer did not know read as 0/NULL.
hasten_coll_options read_options(const hasten_coll_options* o) {
  hasten_coll_options c{};
  if (o != nullptr) std::memcpy(&c, o, std::min<size_t>(o->struct_size, sizeof c));
  return c;
}


}  // namespace hasten::nccl
