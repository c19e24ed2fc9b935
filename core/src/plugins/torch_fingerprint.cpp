// The host's LibTorch build fingerprint, computed by the same SDK macro plugins use, so the
// two strings are equal exactly when plugin and host were built against the same LibTorch.
#include <hasten/plugin_torch.hpp>

#include "plugins/host_api.hpp"

namespace hasten::detail {
const char* host_torch_fingerprint() { return HASTEN_TORCH_FINGERPRINT; }
}  // namespace hasten::detail
