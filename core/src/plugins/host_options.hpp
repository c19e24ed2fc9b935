// The option look-ups of the host API (ABI 1.1), installed into every host table.
#pragma once

#include <hasten/plugin.h>

namespace hasten::detail {

void install_option_lookups(hasten_host_api& api);

}  // namespace hasten::detail
