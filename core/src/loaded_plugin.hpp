// What the registry keeps for one accepted plugin: its public description and a zero-filled
// copy of its vtable (a slot the plugin's older, shorter vtable lacks reads as NULL).
#pragma once

#include <hasten/plugin.h>
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
};

}  // namespace hasten::detail
