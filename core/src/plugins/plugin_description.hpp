// What ABI 1.2 descriptors add (option descriptions, a strategy's config section and the
// distributed_type values that select it), read and checked against the rules of plugin.h.
#pragma once

#include <hasten/plugin.h>
#include <hasten/registry.hpp>

#include <string>

namespace hasten::detail {

// Reads the description into info; returns why it is refused, or "".
std::string read_description(const hasten_plugin_descriptor& d, PluginKind kind, PluginInfo& info);

}  // namespace hasten::detail
