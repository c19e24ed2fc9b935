// Entry point of libhasten-strategy-sharded.so: strategies "zero" (DeepSpeed's vocabulary,
// presets zero1, zero2, zero3, zero2_offload, zero3_offload) and "fsdp" (FSDP's). The reader
// of DeepSpeed's JSON files is in deepspeed_json.cpp.
#include "sharded_strategy.hpp"

#include <iterator>

namespace {

using hasten::sharded::ShardedStrategy;



constexpr hasten_preset kZeroPresets[] = {
    hasten::sdk::make_preset("zero1", "ZeRO stage 1: optimizer state sharded", R"({"stage": 1})"),
    hasten::sdk::make_preset("zero2", "ZeRO stage 2: + gradients sharded", R"({"stage": 2})"),
    hasten::sdk::make_preset("zero3", "ZeRO stage 3: + parameters sharded at rest", R"({"stage": 3})"),
    hasten::sdk::make_preset("zero2_offload", "stage 2, optimizer state and step on the CPU",
                             R"({"stage": 2, "offload_optimizer_device": "cpu"})"),
    hasten::sdk::make_preset("zero3_offload", "stage 3, parameter shards and optimizer on the CPU",
                             R"({"stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu"})"),
};

using hasten::sdk::OptionSpec;
using hasten::sdk::section_only_key;

// DeepSpeed's vocabulary: options under their DeepSpeed names, and the keys of Accelerate's
// deepspeed_config section that set them.
constexpr hasten_option_spec kZeroOptions[] = {
    OptionSpec("stage", HASTEN_OPTION_INT, "0 (plain data parallel) to 3").range(0, 3).default_json("2")
        .section_key("zero_stage"),
    OptionSpec("offload_optimizer_device", HASTEN_OPTION_ENUM, "Where optimizer state and step live (nvme is refused)")
        .allowed("none,cpu,nvme").default_json("\"none\"").section_key("offload_optimizer_device"),
    OptionSpec("offload_param_device", HASTEN_OPTION_ENUM, "Where parameters live between uses, stage 3 (nvme is refused)")
        .allowed("none,cpu,nvme").default_json("\"none\"").section_key("offload_param_device"),
    OptionSpec("gradient_clipping", HASTEN_OPTION_FLOAT, "Global gradient-norm clip (0: none)").min(0)
        .default_json("0").section_key("gradient_clipping"),
    // The host hands the file to this library's reader (deepspeed_json.cpp), whose keys join
    // the config; the strategy itself never sees the path.
    section_only_key("deepspeed_config_file", HASTEN_OPTION_STRING,
                     "A DeepSpeed JSON file: its zero_optimization, gradient_clipping, bf16/fp16 and "
                     "gradient_accumulation_steps join the config"),
    // The host runs the sharded build (unit_built): a section key of the run setting.
    section_only_key("zero3_init_flag", HASTEN_OPTION_BOOL,
                     "Stage 3: each hasten::Unit keeps only this rank's shard once constructed (models built "
                     "after the Accelerator, before prepare)")
        .run_setting("sharded_init"),
    OptionSpec("zero3_save_16bit_model", HASTEN_OPTION_BOOL,
               "true warns: hasten always gathers full weights on save, in the parameters' dtype")
        .section_key("zero3_save_16bit_model"),
    section_only_key("gradient_accumulation_steps", HASTEN_OPTION_INT,
                     "Must agree with gradient_accumulation_steps when both are set")
        .min(1).run_setting("gradient_accumulation_steps"),
    // Accelerate's keys for what hasten does not have: named, so that the strategy refuses a value
    // that asks for it (options.cpp) instead of the host accepting it and nothing happening.
    OptionSpec("offload_optimizer_nvme_path", HASTEN_OPTION_STRING, "Only none (nvme offload is refused)")
        .section_key("offload_optimizer_nvme_path"),
    OptionSpec("offload_param_nvme_path", HASTEN_OPTION_STRING, "Only none (nvme offload is refused)")
        .section_key("offload_param_nvme_path"),
    OptionSpec("deepspeed_moe_layer_cls_names", HASTEN_OPTION_STRING,
               "Only empty (names Python MoE classes; units are the modules the model declares)")
        .section_key("deepspeed_moe_layer_cls_names"),
    OptionSpec("deepspeed_multinode_launcher", HASTEN_OPTION_ENUM,
               "Only standard: one hasten launch per machine (the others are refused)")
        .allowed("standard,pdsh,openmpi,mvapich,mpich,nossh,slurm")
        .section_key("deepspeed_multinode_launcher"),
    OptionSpec("deepspeed_hostfile", HASTEN_OPTION_STRING, "Only none (machines are given to hasten launch)")
        .section_key("deepspeed_hostfile"),
    OptionSpec("deepspeed_exclusion_filter", HASTEN_OPTION_STRING, "Only none (machines are given to hasten launch)")
        .section_key("deepspeed_exclusion_filter"),
    OptionSpec("deepspeed_inclusion_filter", HASTEN_OPTION_STRING, "Only none (machines are given to hasten launch)")
        .section_key("deepspeed_inclusion_filter"),
};

// FSDP's vocabulary: options under FSDP's names, set by Accelerate's fsdp_config keys (the
// same names with an "fsdp_" prefix).
constexpr hasten_option_spec kFsdpOptions[] = {
    OptionSpec("sharding_strategy", HASTEN_OPTION_ENUM, "What is sharded")
        .allowed("FULL_SHARD,SHARD_GRAD_OP,NO_SHARD,HYBRID_SHARD,HYBRID_SHARD_ZERO2").default_json("\"FULL_SHARD\"")
        .section_key("fsdp_sharding_strategy"),
    OptionSpec("reshard_after_forward", HASTEN_OPTION_ANY, "true/false, or a sharding strategy name (FSDP1 files)")
        .section_key("fsdp_reshard_after_forward"),
    OptionSpec("offload_params", HASTEN_OPTION_BOOL, "Parameters and optimizer step on the CPU").default_json("false")
        .section_key("fsdp_offload_params"),
    OptionSpec("cpu_offload", HASTEN_OPTION_BOOL, "Same as offload_params (FSDP's CPUOffload)"),
    OptionSpec("backward_prefetch", HASTEN_OPTION_ENUM, "Gather the next unit during backward (NO_PREFETCH: off)")
        .allowed("BACKWARD_PRE,BACKWARD_POST,NO_PREFETCH").default_json("\"BACKWARD_PRE\"")
        .section_key("fsdp_backward_prefetch"),
    OptionSpec("forward_prefetch", HASTEN_OPTION_BOOL, "Gather the next unit during forward (stage 3)")
        .default_json("false").section_key("fsdp_forward_prefetch"),
    OptionSpec("auto_wrap_policy", HASTEN_OPTION_ENUM, "Set, it warns: units are the modules the model declares (hasten::Unit)")
        .allowed("TRANSFORMER_BASED_WRAP,SIZE_BASED_WRAP,NO_WRAP").section_key("fsdp_auto_wrap_policy"),
    OptionSpec("transformer_layer_cls_to_wrap", HASTEN_OPTION_STRING,
               "Set, it warns: units are the modules the model declares (hasten::Unit)")
        .section_key("fsdp_transformer_layer_cls_to_wrap"),
    OptionSpec("min_num_params", HASTEN_OPTION_INT, "Above 0, it warns: units are the modules the model declares (hasten::Unit)")
        .min(0).section_key("fsdp_min_num_params"),
    OptionSpec("state_dict_type", HASTEN_OPTION_ENUM,
               "FULL_STATE_DICT; the others warn: checkpoints keep full weights, each rank loads its slice")
        .allowed("FULL_STATE_DICT,LOCAL_STATE_DICT,SHARDED_STATE_DICT").section_key("fsdp_state_dict_type"),
    OptionSpec("use_orig_params", HASTEN_OPTION_BOOL, "Accepted; hasten always keeps original parameters")
        .section_key("fsdp_use_orig_params"),
    section_only_key("fsdp_cpu_ram_efficient_loading", HASTEN_OPTION_BOOL,
                     "FULL_SHARD: each hasten::Unit keeps only this rank's shard once constructed (models built "
                     "after the Accelerator, before prepare)")
        .run_setting("sharded_init"),
    OptionSpec("sync_module_states", HASTEN_OPTION_BOOL, "Accepted; prepare always broadcasts rank 0's weights")
        .section_key("fsdp_sync_module_states"),
    // The host runs the checkpointing (every outermost hasten::Unit): a section key of the run
    // setting, never an option of the strategy.
    section_only_key("fsdp_activation_checkpointing", HASTEN_OPTION_BOOL,
                     "Recompute every outermost hasten::Unit's forward in backward")
        .run_setting("activation_checkpointing"),
    OptionSpec("ignored_modules", HASTEN_OPTION_STRING, "Refused (not supported: units are declared by type)")
        .section_key("fsdp_ignored_modules"),
    OptionSpec("version", HASTEN_OPTION_INT, "1 or 2 (both map to hasten's fsdp)").range(1, 2).section_key("fsdp_version"),
};

// The strategies: each reads its options against its vocabulary above (an absent key is its
// default_json there).
class ZeroStrategy final : public hasten::sdk::Strategy {
 public:
  ZeroStrategy(const hasten_host_api* host, std::string_view options)
      : Strategy(host), impl_(host, hasten::sharded::parse_zero_options(host, options, kZeroOptions, std::size(kZeroOptions))) {}
#define HASTEN_FORWARD_STRATEGY                                                                                \
  void prepare_model(torch::nn::Module& m, const hasten_model_info& i) override { impl_.prepare_model(m, i); } \
  void prepare_optimizer(torch::optim::Optimizer& o) override { impl_.prepare_optimizer(o); }                  \
  void set_gradient_sync(torch::nn::Module& m, bool e) override { impl_.set_gradient_sync(m, e); }            \
  void before_backward() override { impl_.before_backward(); }                                                 \
  void after_backward() override { impl_.after_backward(); }                                                   \
  void before_optimizer_step(torch::optim::Optimizer& o) override { impl_.before_optimizer_step(o); }          \
  void after_optimizer_step(torch::optim::Optimizer& o) override { impl_.after_optimizer_step(o); }            \
  double clip_grad_norm(torch::nn::Module& m, double n, double t) override { return impl_.clip_grad_norm(m, n, t); } \
  void unit_pre_forward(torch::nn::Module& m, uint32_t u) override { impl_.unit_pre_forward(m, u); }          \
  void unit_post_forward(torch::nn::Module& m, uint32_t u, at::Tensor* const* o, uint32_t n) override {        \
    impl_.unit_post_forward(m, u, o, n);                                                                        \
  }                                                                                                             \
  void memory_report(hasten_memory_report& r) override { impl_.memory_report(r); }                            \
  void state_dict(torch::nn::Module& m, int32_t k, const Emit& e) override { impl_.state_dict(m, k, e); }      \
  void load_state_dict(torch::nn::Module& m, const NamedTensorRefs& t) override { impl_.load_state_dict(m, t); } \
  void load_state_dict_ranges(torch::nn::Module& m, const ReadRange& r) override { impl_.load_state_dict_ranges(m, r); } \
  void unit_built(torch::nn::Module& u, const hasten_model_info& i) override { impl_.unit_built(u, i); }      \
  void optimizer_state(torch::optim::Optimizer& o, torch::nn::Module& m, const Emit& e) override {            \
    impl_.optimizer_state(o, m, e);                                                                             \
  }                                                                                                             \
  void load_optimizer_state(torch::optim::Optimizer& o, torch::nn::Module& m, const NamedTensorRefs& t) override { \
    impl_.load_optimizer_state(o, m, t);                                                                        \
  }
  HASTEN_FORWARD_STRATEGY

 private:
  ShardedStrategy impl_;
};

class FsdpStrategy final : public hasten::sdk::Strategy {
 public:
  FsdpStrategy(const hasten_host_api* host, std::string_view options)
      : Strategy(host),
        impl_(host, hasten::sharded::parse_fsdp_options(host, options, kFsdpOptions, std::size(kFsdpOptions))) {}
  HASTEN_FORWARD_STRATEGY

 private:
  ShardedStrategy impl_;
};
#undef HASTEN_FORWARD_STRATEGY

using hasten::sdk::answering;
using hasten::sdk::with_options;

constexpr hasten_plugin_descriptor kZero = answering(
    with_options(hasten::sdk::strategy_descriptor<ZeroStrategy>(
                     "zero", "1.0", "ZeRO stages 0-3 with CPU offload (DeepSpeed's options)", kZeroPresets,
                     sizeof(kZeroPresets) / sizeof(kZeroPresets[0])),
                 kZeroOptions),
    "DEEPSPEED", "deepspeed_config");
constexpr hasten_plugin_descriptor kFsdp = answering(
    with_options(hasten::sdk::strategy_descriptor<FsdpStrategy>("fsdp", "1.0", "fully sharded data parallel (FSDP's options)"),
                 kFsdpOptions),
    "FSDP", "fsdp_config");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kZero, &kFsdp)
