// Comparing runs bit for bit: a SHA-256 over tensors' bytes.
#pragma once

#include <hasten/safetensors.hpp>

#include <string>

namespace hasten {

// SHA-256 (64 lowercase hex digits) over the raw bytes of every tensor, taken in name order
// (each made contiguous on the CPU first). Two runs whose parameters are bitwise equal have
// the same checksum; names and shapes are not hashed.
std::string param_checksum(const NamedTensors& tensors);

}  // namespace hasten
