// Seeding: LibTorch's and the C library's generators, per process or per rank.
#include <hasten/accelerator.hpp>
#include <hasten/process.hpp>

#include <torch/utils.h>

#include <cstdlib>

namespace hasten {

void set_seed(uint64_t seed, bool device_specific) {
  uint64_t s = seed;
  if (device_specific) s += static_cast<uint64_t>(detect_process_info(current_environment()).rank);
  torch::manual_seed(s);
  std::srand(static_cast<unsigned>(s));
}

void Accelerator::set_seed(uint64_t seed, bool device_specific) const {
  hasten::set_seed(seed + (device_specific ? static_cast<uint64_t>(process_index()) : 0), false);
}

}  // namespace hasten
