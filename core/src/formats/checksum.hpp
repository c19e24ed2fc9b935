// Checksums: CRC-32C (Castagnoli), which checkpoint manifests and TensorBoard's record framing
// use, and SHA-256, for comparing parameters bit for bit across runs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hasten::detail {

// Incremental CRC-32C: crc = crc32c_update(crc, data, size), starting from 0.
uint32_t crc32c_update(uint32_t crc, const void* data, size_t size);

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  std::array<uint8_t, 32> finish();
  std::string hex();  // finish() as 64 lowercase hex digits

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buffer_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

}  // namespace hasten::detail
