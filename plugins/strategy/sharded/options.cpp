// The two option vocabularies: DeepSpeed's (strategy "zero", set by Accelerate's
// deepspeed_config keys) and FSDP's (strategy "fsdp", set by fsdp_config). The descriptors in
// library.cpp describe each option, so the host has refused unknown keys, wrong types, names
// not allowed and numbers out of range; what is left here is what involves meaning.
#include "sharded_strategy.hpp"

#include <string>
#include <vector>

namespace hasten::sharded {

using sdk::Error;

namespace {

// Devices for offload: "none" or "cpu" ("nvme" swapping is not implemented).
bool offload_to_cpu(const std::string& key, const std::optional<std::string>& device) {
  if (device && *device == "nvme")
    throw Error(HASTEN_ERR_UNSUPPORTED, "zero options: " + key + ": nvme offload is not supported (allowed: none, cpu)");
  return device && *device == "cpu";
}

// FULL_SHARD -> 3, SHARD_GRAD_OP -> 2, NO_SHARD -> 0. The hybrid names shard within a machine and
// replicate across machines: on one machine that is plain sharding; across machines it is HSDP,
// which runs over the device mesh's dp_shard and dp_replicate groups (sharded_strategy.hpp), so
// the mesh must be machines x processes per machine (`hybrid_mesh`).
int stage_of(const std::string& key, const std::string& s, const hasten_process_info& info, bool hybrid_mesh) {
  if (s.rfind("HYBRID_SHARD", 0) == 0 && info.num_nodes > 1 && !hybrid_mesh)
    throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                "fsdp: " + s + " across " + std::to_string(info.num_nodes) +
                    " machines shards within each machine and replicates across them, over the device mesh: set "
                    "parallelism_config's parallelism_config_dp_replicate_size to " + std::to_string(info.num_nodes) +
                    " (the machines) and parallelism_config_dp_shard_size to " + std::to_string(info.local_world_size) +
                    " (the processes of each)");
  if (s == "FULL_SHARD" || s == "HYBRID_SHARD") return 3;
  if (s == "NO_SHARD") return 0;
  if (s == "SHARD_GRAD_OP" || s == "HYBRID_SHARD_ZERO2") return 2;
  throw Error(HASTEN_ERR_INVALID_ARGUMENT,
              "fsdp options: " + key + ": '" + s +
                  "' is not allowed (allowed: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2)");
}

// A string option that only "none" (or empty, Accelerate's unset) may take: anything else asks
// for something hasten does not do, and is refused rather than ignored.
void only_none(const sdk::Options& in, const std::string& key, const std::string& why) {
  const auto v = in.text(key.c_str());
  if (v && !v->empty() && *v != "none")
    throw Error(HASTEN_ERR_UNSUPPORTED, "zero options: " + key + ": '" + *v + "' is not supported (" + why +
                                            "; allowed: none)");
}

}  // namespace

Options parse_zero_options(const hasten_host_api* host, std::string_view json, const hasten_option_spec* specs,
                           size_t n_specs) {
  const sdk::Options in(host, json, specs, n_specs);
  Options o;
  o.label = "zero";
  o.stage = static_cast<int>(in.integer("stage").value());
  o.offload_optimizer = offload_to_cpu("offload_optimizer_device", in.text("offload_optimizer_device"));
  o.offload_params = offload_to_cpu("offload_param_device", in.text("offload_param_device"));
  o.gradient_clipping = in.number("gradient_clipping").value();
  // zero3_init_flag is the host's run setting sharded_init (unit_built).
  if (in.boolean("zero3_save_16bit_model").value_or(false))
    sdk::log(host, HASTEN_LOG_WARN, "zero",
             "zero: zero3_save_16bit_model: hasten always gathers full weights on save, in the parameters' own dtype "
             "(float32 unless the model was built in another)");
  only_none(in, "offload_optimizer_nvme_path", "nvme offload is not supported");
  only_none(in, "offload_param_nvme_path", "nvme offload is not supported");
  only_none(in, "deepspeed_moe_layer_cls_names",
            "it names Python MoE classes; a unit is a module the model declares as a hasten::Unit");
  only_none(in, "deepspeed_hostfile", "hasten launch starts the processes of one machine; give each machine's "
                                      "--machine_rank and --main_process_ip");
  only_none(in, "deepspeed_exclusion_filter", "hasten has no hostfile to filter");
  only_none(in, "deepspeed_inclusion_filter", "hasten has no hostfile to filter");
  if (auto launcher = in.text("deepspeed_multinode_launcher"); launcher && *launcher != "standard")
    throw Error(HASTEN_ERR_UNSUPPORTED, "zero options: deepspeed_multinode_launcher: '" + *launcher +
                                            "' is not supported (hasten launch runs on each machine, as Accelerate's "
                                            "standard launcher does; allowed: standard)");
  if (o.offload_params && o.stage != 3)
    throw Error(HASTEN_ERR_INVALID_ARGUMENT, "zero: offload_param_device: cpu needs stage 3 (the stage is " +
                                                 std::to_string(o.stage) + ")");
  if (o.offload_optimizer && o.stage < 2)
    throw Error(HASTEN_ERR_INVALID_ARGUMENT, "zero: offload_optimizer_device: cpu needs stage 2 or 3 (the stage is " +
                                                 std::to_string(o.stage) + ")");
  return o;
}

Options parse_fsdp_options(const hasten_host_api* host, std::string_view json, const hasten_option_spec* specs,
                           size_t n_specs) {
  const sdk::Options in(host, json, specs, n_specs);
  const hasten_process_info info = sdk::process_info(host);
  const auto shard = sdk::mesh_group(host, "dp_shard"), replicate = sdk::mesh_group(host, "dp_replicate");
  const bool hybrid_mesh = shard && replicate && replicate->size == info.num_nodes && shard->size == info.local_world_size;
  Options o;
  o.label = "fsdp";
  o.stage = stage_of("sharding_strategy", in.text("sharding_strategy").value(), info, hybrid_mesh);
  // reshard_after_forward: FSDP2's boolean, or (FSDP1 files) a sharding strategy name.
  {
    std::optional<bool> flag;
    bool boolean = true;
    try {
      flag = in.boolean("reshard_after_forward");
    } catch (const Error&) {
      boolean = false;  // not a boolean: a name, or the host's message about the type
    }
    if (flag) o.reshard_after_forward = *flag;
    if (!boolean) o.stage = stage_of("reshard_after_forward", in.text("reshard_after_forward").value(), info, hybrid_mesh);
  }
  for (const char* key : {"offload_params", "cpu_offload"})
    if (auto offload = in.boolean(key)) o.offload_params = o.offload_optimizer = *offload;
  o.backward_prefetch = in.text("backward_prefetch").value() != "NO_PREFETCH";
  o.forward_prefetch = in.boolean("forward_prefetch").value();
  if (in.text("ignored_modules"))
    throw Error(HASTEN_ERR_UNSUPPORTED, "fsdp: ignored_modules is not supported (units are declared by type)");
  // Accepted keys that ask for what hasten does another way say so (a config file written for
  // Accelerate keeps working, and nothing it sets passes unremarked). use_orig_params,
  // sync_module_states and version: hasten's behaviour is what they ask for, or better.
  std::vector<std::string> wrap_keys;
  for (const char* key : {"auto_wrap_policy", "transformer_layer_cls_to_wrap"})
    if (auto v = in.text(key); v && !v->empty()) wrap_keys.push_back(key);
  if (in.integer("min_num_params").value_or(0) > 0) wrap_keys.push_back("min_num_params");
  if (!wrap_keys.empty()) {
    std::string keys;
    for (auto& k : wrap_keys) keys += (keys.empty() ? "" : ", ") + k;
    sdk::log(host, HASTEN_LOG_WARN, "fsdp",
             "fsdp: " + keys + " choose FSDP's units in Python (by class, by size, or none); in hasten the units "
             "are the hasten::Unit modules the model declares, and these keys pick nothing");
  }
  if (auto type = in.text("state_dict_type"); type && *type != "FULL_STATE_DICT")
    sdk::log(host, HASTEN_LOG_WARN, "fsdp",
             "fsdp: state_dict_type " + *type + ": hasten's checkpoints keep full weights, written once with chunk "
             "checksums, and each rank reads only its slice when it loads them");
  if (o.stage < 3) o.offload_params = false;  // FSDP offloads parameters only when sharded at rest
  return o;
}

}  // namespace hasten::sharded
