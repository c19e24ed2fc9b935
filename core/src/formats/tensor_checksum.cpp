// hasten::param_checksum: SHA-256 over tensors' bytes in name order.
#include <hasten/checksum.hpp>

#include <algorithm>

#include "formats/checksum.hpp"

namespace hasten {

std::string param_checksum(const NamedTensors& tensors) {
  std::vector<const std::pair<std::string, torch::Tensor>*> sorted;
  for (auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  detail::Sha256 sha;
  for (auto* t : sorted) {
    const torch::Tensor c = t->second.detach().to(torch::kCPU).contiguous();
    sha.update(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  }
  return sha.hex();
}

}  // namespace hasten
