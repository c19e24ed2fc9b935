// What the registry keeps for one accepted plugin: its public description and a zero-filled
// copy of its vtable (a slot the plugin's older, shorter vtable lacks reads as NULL).
#pragma once

#include <hasten/plugin.h>
#include <hasten/plugin_config_file.h>
#include <hasten/registry.hpp>

namespace hasten::detail {

struct LoadedPlugin {
  PluginInfo info;
  union Vtable {
    hasten_strategy_vtable strategy;
    hasten_precision_vtable precision;
    hasten_tracker_vtable tracker;
    hasten_comm_vtable comm;
  } vt{};
  // Strategies: the reader of the strategy's own config file format (plugin_config_file.h),
  // zero-filled when the library declares none (read == NULL).
  hasten_config_file_reader config_file_reader{};
};

}  // namespace hasten::detail
