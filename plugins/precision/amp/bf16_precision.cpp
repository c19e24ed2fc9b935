// Precision "bf16": forward under autocast to bfloat16 (LibTorch's CPU autocast, or CUDA's);
// weights, gradients and optimizer state stay float32 and no loss scaling is needed.
#include <hasten/plugin_torch.hpp>

#include "autocast.hpp"
#include "descriptors.hpp"

namespace hasten::precision {
namespace {

class Bf16Precision final : public sdk::Precision {
 public:
  Bf16Precision(const hasten_host_api* host, std::string_view options) : Precision(host) {
    sdk::require_no_options(options, "precision 'bf16'");
  }
  void* autocast_enter(const DLDevice& device) override {
    AutocastStack::enter(device, at::kBFloat16);
    return nullptr;
  }
  void autocast_exit(void*) override { AutocastStack::exit(); }
};

}  // namespace

const hasten_plugin_descriptor kBf16Descriptor = sdk::without_options(sdk::precision_descriptor<Bf16Precision>(
    "bf16", "1.0", "autocast to bfloat16, float32 weights and optimizer"));

}  // namespace hasten::precision
