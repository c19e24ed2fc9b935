// Host-side handles of plugin instances: each wraps one hasten_instance and its vtable,
// turns status codes into hasten::PluginError (naming the plugin, its file, the call and the
// plugin's own message), skips NULL slots, and never lets an exception from a plugin that
// broke the no-exceptions rule escape unlabelled.
#pragma once

#include <hasten/error.hpp>
#include <hasten/plugin.h>
#include <hasten/registry.hpp>

#include <string>

#include "plugins/loaded_plugin.hpp"

namespace hasten::detail {

// "strategy plugin 'ddp' (preset 'zero2') (/path/libhasten-strategy-ddp.so)"
std::string plugin_label(const PluginSelection& selection);
// The options create() receives: the preset's with the user's JSON object on top, checked
// against the plugin's description; PluginError naming the plugin otherwise.
std::string plugin_options(const PluginSelection& selection, const std::string& user_options_json);

class PluginInstance {
 public:
  PluginInstance(const PluginSelection& selection, const hasten_host_api* host,
                 const std::string& user_options_json);
  ~PluginInstance();
  PluginInstance(const PluginInstance&) = delete;
  PluginInstance& operator=(const PluginInstance&) = delete;

  const PluginInfo& info() const { return plugin_->info; }
  const std::string& name() const { return plugin_->info.name; }
  // "strategy plugin 'ddp' (/path/libhasten-strategy-ddp.so)"
  std::string label() const;

 protected:
  // Runs a slot call; throws PluginError on a non-OK status or an escaped exception.
  template <class Fn>
  void call(const char* op, Fn&& fn) const {
    hasten_status status = HASTEN_OK;
    try {
      status = fn();
    } catch (const std::exception& e) {
      throw PluginError(label() + ": " + op + " threw an exception across the C ABI: " + e.what());
    } catch (...) {
      throw PluginError(label() + ": " + op + " threw an exception across the C ABI");
    }
    if (status != HASTEN_OK) fail(op, status);
  }
  [[noreturn]] void fail(const char* op, hasten_status status) const;

  // An instance the plugin made by other means than create (a comm plugin's split): of
  // `same`'s plugin, owned (destroyed) by this handle.
  PluginInstance(const PluginInstance& same, hasten_instance* adopted)
      : plugin_(same.plugin_), instance_(adopted), preset_(same.preset_) {}

  const LoadedPlugin* plugin_;
  const LoadedPlugin::Vtable& vt() const { return plugin_->vt; }
  hasten_instance* instance_ = nullptr;
  std::string preset_;
};

}  // namespace hasten::detail
