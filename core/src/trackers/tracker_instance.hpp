// The host's view of a tracker plugin instance (C tier).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "plugins/plugin_instances.hpp"

namespace hasten {
struct Config;
}

namespace hasten::detail {

// The configured trackers with the options of each (tracker_options keyed by the name
// `trackers` gives it or by its plugin's name); a key that is neither is a ConfigError.
// init_kwargs (init_trackers's, keyed the same way, each a YAML or JSON mapping) override
// tracker_options key by key; a key that names no tracker, or a value that is not a mapping, is
// a UsageError.
std::vector<std::pair<PluginSelection, std::string>> choose_trackers(const Config& config,
                                                                     const std::map<std::string, std::string>& init_kwargs = {});

// What a tracker keeps beyond scalars: one bit per optional slot of its vtable.
enum : int32_t { kKeepsText = 1, kKeepsImages = 2, kKeepsHistograms = 4, kKeepsTables = 8 };

class TrackerInstance : public PluginInstance {
 public:
  using PluginInstance::PluginInstance;

  int32_t keeps() {
    const auto& t = vt().tracker;
    return (t.log_text ? kKeepsText : 0) | (t.log_image ? kKeepsImages : 0) | (t.log_histogram ? kKeepsHistograms : 0) |
           (t.log_table ? kKeepsTables : 0);
  }

  void start(const std::string& project, const std::string& logging_dir,
             const std::string& hparams_json, int rank) {
    hasten_tracker_run run{};
    run.struct_size = sizeof(run);
    run.abi_version = HASTEN_ABI_VERSION;
    run.project = project.c_str();
    run.logging_dir = logging_dir.c_str();
    run.hparams_json = hparams_json.c_str();
    run.rank = rank;
    call("start", [&] { return vt().tracker.start(instance_, &run); });
  }
  void log_scalars(const std::vector<std::pair<std::string, double>>& values, int64_t step) {
    const auto n = static_cast<uint32_t>(values.size());
    if (HASTEN_ABI_VERSION_MINOR(vt().tracker.abi_version) == 0) {
      // ABI 1.0 trackers know hasten_scalar without its struct header.
      struct ScalarV10 {
        const char* name;
        double value;
      };
      std::vector<ScalarV10> scalars;
      scalars.reserve(values.size());
      for (auto& [name, value] : values) scalars.push_back({name.c_str(), value});
      call("log_scalars", [&] {
        return vt().tracker.log_scalars(instance_, reinterpret_cast<const hasten_scalar*>(scalars.data()), n, step);
      });
      return;
    }
    std::vector<hasten_scalar> scalars;
    scalars.reserve(values.size());
    for (auto& [name, value] : values) scalars.push_back({HASTEN_STRUCT_INIT(hasten_scalar), name.c_str(), value});
    call("log_scalars", [&] { return vt().tracker.log_scalars(instance_, scalars.data(), n, step); });
  }
  void log_text(const std::string& name, const std::string& text, int64_t step) {
    if (auto fn = vt().tracker.log_text)
      call("log_text", [&] { return fn(instance_, name.c_str(), text.c_str(), step); });
  }
  void log_image(const std::string& name, const std::vector<uint8_t>& pixels, uint32_t h, uint32_t w, uint32_t c,
                 int64_t step) {
    if (auto fn = vt().tracker.log_image)
      call("log_image", [&] { return fn(instance_, name.c_str(), pixels.data(), h, w, c, step); });
  }
  void log_histogram(const std::string& name, const std::vector<double>& values, int64_t step) {
    if (auto fn = vt().tracker.log_histogram)
      call("log_histogram", [&] { return fn(instance_, name.c_str(), values.data(), values.size(), step); });
  }
  void log_table(const std::string& name, const std::string& table_json, int64_t step) {
    if (auto fn = vt().tracker.log_table)
      call("log_table", [&] { return fn(instance_, name.c_str(), table_json.c_str(), step); });
  }
  // The tracker's run_info JSON text (ABI 1.10), "{}" when its plugin has no such slot.
  std::string run_info() {
    const auto& t = vt().tracker;
    // A plugin of an older minor has no run_info field: its struct_size ends before it.
    if (t.struct_size < offsetof(hasten_tracker_vtable, run_info) + sizeof(t.run_info) || t.run_info == nullptr)
      return "{}";
    const char* json = nullptr;
    call("run_info", [&] { return t.run_info(instance_, &json); });
    return json != nullptr ? json : "{}";
  }
  void flush() {
    if (auto fn = vt().tracker.flush) call("flush", [&] { return fn(instance_); });
  }
  void finish(hasten_status status) {
    if (auto fn = vt().tracker.finish) call("finish", [&] { return fn(instance_, status); });
  }
};

}  // namespace hasten::detail
