// Calling strategies' readers of their own config file formats.
#include "config/config_file_readers.hpp"

#include <hasten/error.hpp>
#include <hasten/registry.hpp>

#include "plugins/host_api.hpp"
#include "plugins/loaded_plugin.hpp"

namespace hasten::detail {

using json = nlohmann::json;

namespace {

const hasten_config_file_reader* reader_of(const std::string& strategy) {
  try {
    const PluginSelection s = PluginRegistry::instance().select(PluginKind::Strategy, strategy);
    if (s.plugin != nullptr && s.plugin->config_file_reader.read != nullptr) return &s.plugin->config_file_reader;
  } catch (const Error&) {  // an unknown strategy has no reader; it is reported where it is created
  }
  return nullptr;
}

// nullopt: the reader does not recognize the file.
std::optional<json> call(const hasten_config_file_reader& r, const std::string& path) {
  int32_t recognized = 0;
  std::string emitted;
  auto emit = [](void* ctx, const char* text) { *static_cast<std::string*>(ctx) = text != nullptr ? text : ""; };
  clear_plugin_error();
  hasten_status status = HASTEN_ERR_INTERNAL;
  try {
    status = r.read(registry_host(), path.c_str(), &recognized, emit, &emitted);
  } catch (...) {
    throw ConfigError(std::string("config error: the ") + r.format + " reader of strategy '" + r.strategy +
                      "' threw an exception reading '" + path + "'");
  }
  if (status != HASTEN_OK) throw ConfigError("config error: " + take_plugin_error("the reader failed"));
  if (recognized == 0) return std::nullopt;
  json values = json::parse(emitted, nullptr, /*allow_exceptions=*/false);
  if (values.is_discarded() || !values.is_object())
    throw ConfigError(std::string("config error: the ") + r.format + " reader of strategy '" + r.strategy +
                      "' returned no JSON object for '" + path + "'");
  return values;
}

}  // namespace

std::optional<NativeConfig> read_native_config(const std::string& path) {
  for (const auto& p : PluginRegistry::instance().plugins()) {
    if (p.kind != PluginKind::Strategy) continue;
    const hasten_config_file_reader* r = reader_of(p.name);
    if (r == nullptr) continue;
    if (auto values = call(*r, path)) return NativeConfig{std::move(*values), r->strategy, r->format};
  }
  return std::nullopt;
}

std::string reader_section_key(const std::string& strategy) {
  const hasten_config_file_reader* r = reader_of(strategy);
  return r != nullptr && r->section_key != nullptr ? r->section_key : "";
}

NativeConfig read_strategy_config_file(const std::string& strategy, const std::string& path, const std::string& where) {
  const hasten_config_file_reader* r = reader_of(strategy);
  if (r == nullptr) throw ConfigError("config error: " + where + ": strategy '" + strategy + "' reads no files");
  auto values = call(*r, path);
  if (!values)
    throw ConfigError("config error: " + where + ": '" + path + "' is not a " + r->format +
                      " file (missing, unreadable, not JSON, or none of its keys)");
  return NativeConfig{std::move(*values), r->strategy, r->format};
}

}  // namespace hasten::detail
