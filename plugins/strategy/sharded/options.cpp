// The two option vocabularies: DeepSpeed's (strategy "zero", Accelerate's deepspeed_config
// keys) and FSDP's (strategy "fsdp", Accelerate's fsdp_config keys without "fsdp_").
#include <nlohmann/json.hpp>

#include "sharded_strategy.hpp"

namespace hasten::sharded {

using sdk::Error;

namespace {

nlohmann::json parse(std::string_view text, const std::string& label) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw Error(HASTEN_ERR_INVALID_ARGUMENT, label + " options are not a JSON object");
  return j;
}

[[noreturn]] void bad(const std::string& key, const nlohmann::json& v, const std::string& allowed) {
  throw Error(HASTEN_ERR_INVALID_ARGUMENT,
              "strategy_options." + key + ": " + v.dump() + " is not allowed (allowed: " + allowed + ")");
}

bool boolean(const std::string& k, const nlohmann::json& v) {
  if (!v.is_boolean()) bad(k, v, "true, false");
  return v.get<bool>();
}

std::string text(const std::string& k, const nlohmann::json& v, const std::vector<std::string>& allowed) {
  std::string all;
  for (auto& a : allowed) all += (all.empty() ? "" : ", ") + a;
  if (!v.is_string()) bad(k, v, all);
  for (auto& a : allowed)
    if (a == v.get<std::string>()) return a;
  bad(k, v, all);
}

// Devices for offload: "none" or "cpu" ("nvme" swapping is not implemented).
bool offload_to_cpu(const std::string& k, const nlohmann::json& v) {
  const std::string d = text(k, v, {"none", "cpu", "nvme"});
  if (d == "nvme")
    throw Error(HASTEN_ERR_UNSUPPORTED, "strategy_options." + k + ": nvme offload is not supported (allowed: none, cpu)");
  return d == "cpu";
}

}  // namespace

Options parse_zero_options(std::string_view json) {
  Options o;
  o.label = "zero";
  const auto j = parse(json, "zero");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const auto& v = it.value();
    if (k == "stage") {
      if (!v.is_number_integer() || v.get<int>() < 0 || v.get<int>() > 3) bad(k, v, "0, 1, 2, 3");
      o.stage = v.get<int>();
    } else if (k == "offload_optimizer_device") {
      o.offload_optimizer = offload_to_cpu(k, v);
    } else if (k == "offload_param_device") {
      o.offload_params = offload_to_cpu(k, v);
    } else if (k == "gradient_clipping") {
      if (!v.is_number() || v.get<double>() < 0) bad(k, v, "a number >= 0");
      o.gradient_clipping = v.get<double>();
    } else if (k == "deepspeed_config_file") {
      throw Error(HASTEN_ERR_UNSUPPORTED,
                  "deepspeed_config.deepspeed_config_file: DeepSpeed JSON files are not read; set zero_stage, "
                  "offload_optimizer_device, offload_param_device and gradient_clipping in deepspeed_config");
    } else if (k == "zero3_init_flag" || k == "zero3_save_16bit_model") {
      boolean(k, v);  // accepted: hasten always builds full models first and always saves full weights
    } else if (k == "gradient_accumulation_steps" || k == "offload_optimizer_nvme_path" || k == "offload_param_nvme_path") {
      // handled by the core (accumulation) or meaningless without nvme offload
    } else {
      throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                  "strategy_options: unknown key '" + k +
                      "' for zero (allowed: stage, offload_optimizer_device, offload_param_device, gradient_clipping, "
                      "zero3_init_flag, zero3_save_16bit_model)");
    }
  }
  if (o.offload_params && o.stage != 3)
    throw Error(HASTEN_ERR_INVALID_ARGUMENT, "zero: offload_param_device: cpu needs stage 3 (the stage is " +
                                                 std::to_string(o.stage) + ")");
  if (o.offload_optimizer && o.stage < 2)
    throw Error(HASTEN_ERR_INVALID_ARGUMENT, "zero: offload_optimizer_device: cpu needs stage 2 or 3 (the stage is " +
                                                 std::to_string(o.stage) + ")");
  return o;
}

Options parse_fsdp_options(std::string_view json, int num_nodes) {
  Options o;
  o.label = "fsdp";
  o.stage = 3;  // FULL_SHARD
  o.backward_prefetch = true;  // BACKWARD_PRE
  const auto j = parse(json, "fsdp");
  auto sharding = [&](const std::string& k, const nlohmann::json& v) {
    const std::string s = text(k, v, {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"});
    if (s.rfind("HYBRID_SHARD", 0) == 0 && num_nodes > 1)
      throw Error(HASTEN_ERR_UNSUPPORTED,
                  "fsdp: " + s + " across " + std::to_string(num_nodes) +
                      " machines needs process subgroups, which hasten's comm layer does not have yet; use FULL_SHARD "
                      "or SHARD_GRAD_OP");
    // On one machine hybrid sharding is plain sharding over its ranks.
    o.stage = s == "FULL_SHARD" || s == "HYBRID_SHARD" ? 3 : s == "NO_SHARD" ? 0 : 2;
  };
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const auto& v = it.value();
    if (k == "sharding_strategy") {
      sharding(k, v);
    } else if (k == "reshard_after_forward") {
      if (v.is_string()) sharding(k, v);  // FSDP1 files write a sharding strategy here
      else o.reshard_after_forward = boolean(k, v);
    } else if (k == "offload_params" || k == "cpu_offload") {
      o.offload_params = o.offload_optimizer = boolean(k, v);
    } else if (k == "backward_prefetch") {
      o.backward_prefetch = text(k, v, {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"}) != "NO_PREFETCH";
    } else if (k == "activation_checkpointing") {
      if (boolean(k, v))
        throw Error(HASTEN_ERR_UNSUPPORTED, "fsdp: activation_checkpointing is not supported");
    } else if (k == "ignored_modules") {
      throw Error(HASTEN_ERR_UNSUPPORTED, "fsdp: ignored_modules is not supported (units are declared by type)");
    } else if (k == "auto_wrap_policy") {
      text(k, v, {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"});  // C++ units are declared by type
    } else if (k == "version") {
      if (!v.is_number_integer() || (v.get<int>() != 1 && v.get<int>() != 2)) bad(k, v, "1, 2");
    } else if (k == "state_dict_type") {
      text(k, v, {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"});
    } else if (k == "forward_prefetch" || k == "use_orig_params" || k == "cpu_ram_efficient_loading" ||
               k == "sync_module_states") {
      boolean(k, v);
    } else if (k == "min_num_params") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) bad(k, v, "an integer >= 0");
    } else if (k == "transformer_layer_cls_to_wrap") {
      if (!v.is_string()) bad(k, v, "a comma-separated list of module names");
    } else {
      throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                  "strategy_options: unknown key '" + k +
                      "' for fsdp (allowed: sharding_strategy, reshard_after_forward, offload_params, "
                      "backward_prefetch, forward_prefetch, auto_wrap_policy, transformer_layer_cls_to_wrap, "
                      "min_num_params, state_dict_type, use_orig_params, cpu_ram_efficient_loading, "
                      "sync_module_states, activation_checkpointing, version)");
    }
  }
  if (o.stage < 3) o.offload_params = false;  // FSDP offloads parameters only when sharded at rest
  return o;
}

}  // namespace hasten::sharded
