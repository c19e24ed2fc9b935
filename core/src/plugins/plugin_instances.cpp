#include "plugins/plugin_instances.hpp"

#include <nlohmann/json.hpp>


#include "config/described_options.hpp"
#include "plugins/host_api.hpp"

namespace hasten::detail {

namespace {

using CreateFn = hasten_status (*)(const hasten_host_api*, const char*, hasten_instance**);
using DestroyFn = void (*)(hasten_instance*);

CreateFn create_slot(const LoadedPlugin& p) {
  switch (p.info.kind) {
    case PluginKind::Strategy: return p.vt.strategy.create;
    case PluginKind::Precision: return p.vt.precision.create;
    case PluginKind::Tracker: return p.vt.tracker.create;
    case PluginKind::Comm: return p.vt.comm.create;
  }
  return nullptr;
}

DestroyFn destroy_slot(const LoadedPlugin& p) {
  switch (p.info.kind) {
    case PluginKind::Strategy: return p.vt.strategy.destroy;
    case PluginKind::Precision: return p.vt.precision.destroy;
    case PluginKind::Tracker: return p.vt.tracker.destroy;
    case PluginKind::Comm: return p.vt.comm.destroy;
  }
  return nullptr;
}

}  // namespace

std::string plugin_label(const PluginSelection& selection) {
  const PluginInfo& info = selection.plugin->info;
  std::string s = std::string(to_string(info.kind)) + " plugin '" + info.name + "'";
  if (!selection.preset.empty()) s += " (preset '" + selection.preset + "')";
  return s + " (" + info.file + ")";
}

std::string plugin_options(const PluginSelection& selection, const std::string& user_options_json) {
  // The preset's options, with the user's on top.
  nlohmann::json options = nlohmann::json::parse(selection.preset_options_json, nullptr, false);
  nlohmann::json user = nlohmann::json::parse(user_options_json, nullptr, false);
  if (options.is_discarded() || !options.is_object()) options = nlohmann::json::object();
  if (user.is_discarded() || !user.is_object())
    throw PluginError(plugin_label(selection) + ": options are not a JSON object: " + user_options_json);
  options.merge_patch(user);
  // A plugin that describes its options never sees a key or a value its description refuses.
  if (const std::string why = described_options_error(selection.plugin->info, options); !why.empty())
    throw PluginError(plugin_label(selection) + ": " + why);
  return options.dump();
}

PluginInstance::PluginInstance(const PluginSelection& selection, const hasten_host_api* host,
                               const std::string& user_options_json)
    : plugin_(selection.plugin), preset_(selection.preset) {
  const std::string text = plugin_options(selection, user_options_json);
  clear_plugin_error();
  hasten_status status = HASTEN_OK;
  try {
    status = create_slot(*plugin_)(host, text.c_str(), &instance_);
  } catch (const std::exception& e) {
    throw PluginError(label() + ": create threw an exception across the C ABI: " + e.what());
  } catch (...) {
    throw PluginError(label() + ": create threw an exception across the C ABI");
  }
  if (status != HASTEN_OK) fail("create", status);
  if (instance_ == nullptr) throw PluginError(label() + ": create returned no instance");
}

PluginInstance::~PluginInstance() {
  if (instance_ == nullptr) return;
  try {
    destroy_slot(*plugin_)(instance_);
  } catch (...) {  // a plugin failure never takes the host down
  }
}

std::string PluginInstance::label() const {
  PluginSelection selection;
  selection.plugin = plugin_;
  selection.preset = preset_;
  return plugin_label(selection);
}

void PluginInstance::fail(const char* op, hasten_status status) const {
  throw PluginError(label() + ": " + op + " failed (" + status_name(status) +
                    "): " + take_plugin_error());
}

}  // namespace hasten::detail
