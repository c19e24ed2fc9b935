// DeepSpeed's JSON config, read for the zero strategy (plugin_config_file.h): the keys hasten
// implements become config keys in Accelerate's names (deepspeed_config.zero_stage, ...,
// mixed_precision, gradient_accumulation_steps, the fp16 plugin's precision_options); "auto"
// leaves a value to the run; keys hasten does not implement are named in one warning, and the
// ones whose omission would train differently (optimizer, scheduler, a static loss scale)
// are errors. No LibTorch here.
#include <hasten/plugin_config_file.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using json = nlohmann::json;

struct Translation {
  json out = json::object();
  std::vector<std::string> ignored;  // keys named in the warning
  std::string error;                 // the first key that cannot be ignored
};

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// A key DeepSpeed reads but hasten does not implement: ignored, and named.
void ignore(Translation& t, const std::string& key) { t.ignored.push_back(key); }

void refuse(Translation& t, const std::string& key, const std::string& why) {
  if (t.error.empty()) t.error = key + ": " + why;
}

// offload_optimizer / offload_param: the device is hasten's, the rest tunes DeepSpeed's copy.
void offload(Translation& t, const json& section, const std::string& name, const std::string& device_key,
             const std::string& nvme_key) {
  if (!section.is_object()) return refuse(t, "zero_optimization." + name, "expected an object");
  for (auto it = section.begin(); it != section.end(); ++it) {
    const std::string key = "zero_optimization." + name + "." + it.key();
    if (it.key() == "device") {
      if (!is_auto(it.value())) t.out["deepspeed_config"][device_key] = it.value();
    } else if (it.key() == "nvme_path") {
      if (!is_auto(it.value())) t.out["deepspeed_config"][nvme_key] = it.value();
    } else {
      ignore(t, key);  // pin_memory, buffer_count, buffer_size, max_in_cpu, ratio, fast_init
    }
  }
}

void zero_optimization(Translation& t, const json& z) {
  if (!z.is_object()) return refuse(t, "zero_optimization", "expected an object");
  for (auto it = z.begin(); it != z.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "stage") {
      if (!is_auto(v)) t.out["deepspeed_config"]["zero_stage"] = v;
    } else if (k == "offload_optimizer") {
      offload(t, v, k, "offload_optimizer_device", "offload_optimizer_nvme_path");
    } else if (k == "offload_param") {
      offload(t, v, k, "offload_param_device", "offload_param_nvme_path");
    } else if (k == "stage3_gather_16bit_weights_on_model_save") {
      if (!is_auto(v)) t.out["deepspeed_config"]["zero3_save_16bit_model"] = v;
    } else {
      // overlap_comm, contiguous_gradients, bucket sizes, stage3_prefetch and persistence
      // knobs, sub_group_size, round_robin_gradients...: how DeepSpeed schedules its
      // communication, not what is computed.
      ignore(t, "zero_optimization." + k);
    }
  }
}

// bf16 / fp16 sections: enabled selects the precision; fp16's loss scaling maps onto the fp16
// plugin's dynamic scaler (DeepSpeed grows by 2 and backs off by 0.5, as it does).
void precision(Translation& t, const json& root) {
  std::string enabled;
  bool disabled_explicitly = false;
  for (const char* name : {"bf16", "fp16"}) {
    if (!root.contains(name)) continue;
    const json& s = root.at(name);
    if (!s.is_object()) return refuse(t, name, "expected an object");
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string key = std::string(name) + "." + it.key();
      const json& v = it.value();
      if (it.key() == "enabled") {
        if (is_auto(v)) continue;
        if (!v.is_boolean()) return refuse(t, key, "expected true, false or \"auto\"");
        if (!v.get<bool>()) {
          disabled_explicitly = true;
        } else {
          if (!enabled.empty()) return refuse(t, key, "bf16 and fp16 are both enabled; enable one");
          enabled = name;
        }
      } else if (std::string(name) == "fp16" && it.key() == "loss_scale") {
        if (is_auto(v)) continue;
        if (!v.is_number() || v.get<double>() != 0.0)
          return refuse(t, key, "a static loss scale (" + v.dump() +
                                     ") is not supported; 0 (dynamic scaling) is, with initial_scale_power and "
                                     "loss_scale_window");
      } else if (std::string(name) == "fp16" && it.key() == "initial_scale_power") {
        if (is_auto(v)) continue;
        if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > 64)
          return refuse(t, key, "expected an integer from 0 to 64, got " + v.dump());
        t.out["precision_options"]["init_scale"] = std::ldexp(1.0, static_cast<int>(v.get<long long>()));
      } else if (std::string(name) == "fp16" && it.key() == "loss_scale_window") {
        if (!is_auto(v)) t.out["precision_options"]["growth_interval"] = v;
      } else {
        ignore(t, key);  // hysteresis, consecutive_hysteresis, min_loss_scale, auto_cast, ...
      }
    }
  }
  if (!enabled.empty()) {
    t.out["mixed_precision"] = enabled;
  } else if (disabled_explicitly) {
    t.out["mixed_precision"] = "no";
  }
  // The scaler's options belong to fp16 only (another precision plugin refuses them).
  if (enabled != "fp16") t.out.erase("precision_options");
}

Translation translate(const json& root) {
  Translation t;
  t.out["distributed_type"] = "DEEPSPEED";  // the zero strategy answers to it
  t.out["deepspeed_config"] = json::object();
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "zero_optimization") {
      zero_optimization(t, v);
    } else if (k == "gradient_clipping") {
      if (!is_auto(v)) t.out["deepspeed_config"]["gradient_clipping"] = v;
    } else if (k == "gradient_accumulation_steps") {
      if (!is_auto(v)) t.out["gradient_accumulation_steps"] = v;
    } else if (k == "bf16" || k == "fp16") {
      // precision() below, once both are known.
    } else if (k == "train_micro_batch_size_per_gpu" || k == "train_batch_size") {
      // The program's loader sets the batch size; "auto" says the same.
      if (!is_auto(v)) ignore(t, k);
    } else if (k == "optimizer" || k == "scheduler") {
      refuse(t, k,
             "hasten trains with the program's own " + k +
                 " (DeepSpeed would build this one instead); remove the section from the file");
    } else {
      ignore(t, k);  // steps_per_print, wall_clock_breakdown, communication_data_type, ...
    }
  }
  precision(t, root);
  return t;
}

// Recognized: a JSON object with a key only DeepSpeed's files have, and none of Accelerate's
// own config keys (an Accelerate config written as JSON is read as a config file).
bool is_deepspeed_json(const json& root) {
  if (!root.is_object()) return false;
  for (const char* accelerate : {"distributed_type", "compute_environment", "num_processes", "mixed_precision"})
    if (root.contains(accelerate)) return false;
  for (const char* ds : {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "bf16", "fp16",
                         "gradient_clipping", "optimizer", "scheduler", "steps_per_print", "zero_allow_untested_optimizer"})
    if (root.contains(ds)) return true;
  return false;
}

hasten_status read_deepspeed_json(const hasten_host_api* host, const char* path, int32_t* recognized,
                                  void (*emit)(void* ctx, const char* config_json), void* ctx) {
  *recognized = 0;
  try {
    std::ifstream in(path);
    if (!in) return HASTEN_OK;  // the host reports a file it cannot read as a config file
    std::stringstream text;
    text << in.rdbuf();
    const json root = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded() || !is_deepspeed_json(root)) return HASTEN_OK;
    *recognized = 1;
    const Translation t = translate(root);
    if (!t.error.empty()) {
      host->set_error(host, ("DeepSpeed JSON '" + std::string(path) + "': " + t.error).c_str());
      return HASTEN_ERR_UNSUPPORTED;
    }
    if (!t.ignored.empty()) {
      std::string names;
      for (const auto& k : t.ignored) names += (names.empty() ? "" : ", ") + k;
      host->log(host, HASTEN_LOG_WARN, "zero",
                ("DeepSpeed JSON '" + std::string(path) + "': not implemented by hasten, ignored: " + names).c_str());
    }
    json out = t.out;
    if (out["deepspeed_config"].empty()) out.erase("deepspeed_config");
    emit(ctx, out.dump().c_str());
    return HASTEN_OK;
  } catch (const std::exception& e) {
    host->set_error(host, ("DeepSpeed JSON '" + std::string(path) + "': " + e.what()).c_str());
    return HASTEN_ERR_INTERNAL;
  }
}

constexpr hasten_config_file_reader kDeepSpeedJson = {
    HASTEN_STRUCT_INIT(hasten_config_file_reader), "zero", "DeepSpeed JSON", "deepspeed_config_file",
    &read_deepspeed_json};

}  // namespace

extern "C" HASTEN_PLUGIN_EXPORT hasten_status hasten_config_file_readers_v1(const hasten_host_api* host,
                                                                             uint32_t host_abi,
                                                                             const hasten_config_file_reader* const** out,
                                                                             uint32_t* count) {
  static const hasten_config_file_reader* const list[] = {&kDeepSpeedJson};
  (void)host;
  if (HASTEN_ABI_VERSION_MAJOR(host_abi) != HASTEN_ABI_MAJOR) return HASTEN_ERR_UNSUPPORTED;
  *out = list;
  *count = 1;
  return HASTEN_OK;
}
