// Entry point of libhasten-precision-amp.so: precision plugins "no", "bf16" and "fp16".
#include <hasten/plugin_torch.hpp>

#include "descriptors.hpp"

HASTEN_PLUGIN_LIBRARY(&hasten::precision::kNoDescriptor, &hasten::precision::kBf16Descriptor,
                      &hasten::precision::kFp16Descriptor)
