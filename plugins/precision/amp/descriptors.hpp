// The plugins this library declares (defined next to each class).
#pragma once

#include <hasten/plugin.h>

namespace hasten::precision {
extern const hasten_plugin_descriptor kNoDescriptor;
extern const hasten_plugin_descriptor kBf16Descriptor;
extern const hasten_plugin_descriptor kFp16Descriptor;
}  // namespace hasten::precision
