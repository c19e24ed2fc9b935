// The nccl plugin's vocabulary around NCCL and CUDA: their errors as hasten statuses and one
// line each, the NCCL version check, and the ABI's dtypes and reductions in NCCL's terms.
#pragma once

#include <hasten/plugin.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <string>

namespace hasten::nccl {

// Throws (HASTEN_ERR_SYSTEM) naming `what` and, when given, the operation ("allreduce").
void cuda_check(cudaError_t e, const char* what, const char* op = nullptr);
hasten_status status_of(ncclResult_t r);
// NCCL's string for r, with ncclGetLastError's detail where it has one.
std::string nccl_text(ncclResult_t r);
// ncclInProgress is not a failure: the caller settles it (NcclComm::settle).
void nccl_check(ncclResult_t r, const std::string& what);

// NCCL_VERSION_CODE's encoding: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z since 2.9.
struct NcclVersion {
  int major, minor, patch;
  explicit NcclVersion(int code)
      : major(code >= 10000 ? code / 10000 : code / 1000),
        minor(code >= 10000 ? code / 100 % 100 : code / 100 % 10),
        patch(code % 100) {}
  std::string text() const { return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch); }
};

// The runtime's libnccl against this plugin's nccl.h: one line naming both when they differ in
// major.minor. Needs no GPU.
NcclVersion checked_nccl_version();

// " (CUDA_VISIBLE_DEVICES=...)" when it is set, for messages about devices.
std::string visible_devices_note();
// Milliseconds as seconds, for messages ("1.5").
std::string seconds(int64_t ms);
// The ABI's dtype and reduction in NCCL's terms; Error (unsupported) for one NCCL lacks.
ncclDataType_t nccl_type(const DLDataType& d);
ncclRedOp_t nccl_op(hasten_reduce_op op);
// The per-call options, read as the ABI says: min(struct_size, our size) bytes into zeroed
// storage, so that fields the writer did not know read as 0/NULL.
hasten_coll_options read_options(const hasten_coll_options* o);

}  // namespace hasten::nccl
