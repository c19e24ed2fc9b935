// One stored tensor's bytes (a safetensors data section) read into a new CPU tensor: what
// load_safetensors does for every entry and a streamed unit (offload/unit_stream.hpp) for each
// of its weights before a forward. Defined in safetensors.cpp.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hasten::detail {

// Reads exactly `n` bytes at `offset` into `dst`; false when the file ends first; throws
// hasten::Error on a read error.
using ReadAt = std::function<bool(void* dst, uint64_t n, uint64_t offset)>;

// A new CPU tensor of `dtype` and `shape` holding the `bytes` bytes at `offset`, read straight
// into its storage (no buffer besides). hasten::Error, starting with `where` and naming the
// tensor `name`, when it cannot be allocated, when `bytes` do not hold the shape, when the file
// ends first, or when a BOOL byte is other than 0 or 1 (a C++ bool with an undefined value).
torch::Tensor read_tensor_bytes(const ReadAt& read, torch::ScalarType dtype, const std::vector<int64_t>& shape,
                                uint64_t offset, uint64_t bytes, const std::string& where, const std::string& name);

}  // namespace hasten::detail
