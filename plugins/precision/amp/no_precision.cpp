// Precision "no": float32 throughout. It fills no optional slot, so the host never calls it
// during training.
#include <hasten/plugin_torch.hpp>

#include "descriptors.hpp"

namespace hasten::precision {
namespace {

class NoPrecision final : public sdk::Precision {
 public:
  NoPrecision(const hasten_host_api* host, std::string_view options) : Precision(host) {
    sdk::require_no_options(options, "precision 'no'");
  }
};

}  // namespace

const hasten_plugin_descriptor kNoDescriptor =
    sdk::without_options(sdk::precision_descriptor<NoPrecision>("no", "1.0", "float32 everywhere"));

}  // namespace hasten::precision
