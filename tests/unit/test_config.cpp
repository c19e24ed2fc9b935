// Configuration: precedence of the sources, Accelerate's keys, and every class of error.
#include <hasten/config.hpp>
#include <hasten/error.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.hpp"

namespace fs = std::filesystem;
using hasten::Config;
using hasten::ConfigError;
using hasten::Environment;
using hasten::Options;

namespace {

// An environment with a private HASTEN_HOME, so no user default file leaks in.
Environment clean_env(const fs::path& home) { return {{"HASTEN_HOME", home.string()}}; }

std::string error_of(const Options& o, const Environment& env) {
  try {
    hasten::resolve_config(o, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Config, DefaultsWithoutAnySource) {
  hasten::test::TempDir dir;
  Config c = hasten::resolve_config({}, clean_env(dir.path()));
  EXPECT_EQ(c.strategy, "single");
  EXPECT_EQ(c.precision, "no");
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.num_processes, 1);
  EXPECT_TRUE(c.config_file.empty());
  EXPECT_EQ(c.origin.at("mixed_precision"), "default");
}

TEST(Config, PrecedenceDefaultsFileEnvironmentCode) {
  hasten::test::TempDir dir;
  const auto file = dir.write("c.yaml", "mixed_precision: bf16\ngradient_accumulation_steps: 2\nnum_processes: 4\n");
  Environment env = clean_env(dir.path());
  Options o;
  o.config_file = file;

  Config c = hasten::resolve_config(o, env);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.precision, "bf16");
  EXPECT_EQ(c.origin.at("gradient_accumulation_steps"), "file " + file);

  env["HASTEN_GRADIENT_ACCUMULATION_STEPS"] = "3";
  c = hasten::resolve_config(o, env);
  EXPECT_EQ(c.gradient_accumulation_steps, 3);
  EXPECT_EQ(c.origin.at("gradient_accumulation_steps"), "env HASTEN_GRADIENT_ACCUMULATION_STEPS");
  EXPECT_EQ(c.num_processes, 4);  // still from the file

  o.gradient_accumulation_steps = 4;
  c = hasten::resolve_config(o, env);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.origin.at("gradient_accumulation_steps"), "code");
  EXPECT_EQ(c.precision, "bf16");
}

TEST(Config, DefaultFileAndConfigFileVariable) {
  hasten::test::TempDir dir;
  dir.write("default_config.yaml", "mixed_precision: bf16\n");
  const auto other = dir.write("other.yaml", "mixed_precision: fp16\n");
  Environment env = clean_env(dir.path());
  EXPECT_EQ(hasten::resolve_config({}, env).mixed_precision, "bf16");
  env["HASTEN_CONFIG_FILE"] = other;
  EXPECT_EQ(hasten::resolve_config({}, env).mixed_precision, "fp16");
}

TEST(Config, LauncherJsonReplacesTheFileLayer) {
  hasten::test::TempDir dir;
  dir.write("default_config.yaml", "mixed_precision: bf16\ngradient_accumulation_steps: 8\n");
  Environment env = clean_env(dir.path());
  env["HASTEN_CONFIG_JSON"] = R"({"gradient_accumulation_steps": 2})";
  Config c = hasten::resolve_config({}, env);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.mixed_precision, "no");  // the default file is not read under the launcher
  env["HASTEN_GRADIENT_ACCUMULATION_STEPS"] = "5";  // a per-key variable beats the launcher's JSON
  EXPECT_EQ(hasten::resolve_config({}, env).gradient_accumulation_steps, 5);
}

TEST(Config, AccelerateFileSelectsTheSameStrategy) {
  hasten::test::TempDir dir;
  // Accelerate's DeepSpeed ZeRO-3 example config, as `accelerate config` writes it.
  const auto ds = dir.write("ds.yaml", R"(compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  gradient_accumulation_steps: 1
  gradient_clipping: 1.0
  offload_optimizer_device: cpu
  offload_param_device: cpu
  zero3_init_flag: true
  zero3_save_16bit_model: true
  zero_stage: 3
distributed_type: DEEPSPEED
downcast_bf16: 'no'
enable_cpu_affinity: false
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
)");
  Options o;
  o.config_file = ds;
  Config c = hasten::resolve_config(o, clean_env(dir.path()));
  EXPECT_EQ(c.strategy, "zero");
  EXPECT_EQ(c.precision, "bf16");
  EXPECT_EQ(c.num_processes, 8);
  auto opts = nlohmann::json::parse(c.strategy_options);
  EXPECT_EQ(opts.at("stage"), 3);
  EXPECT_EQ(opts.at("offload_optimizer_device"), "cpu");
  EXPECT_EQ(opts.at("offload_param_device"), "cpu");
  EXPECT_DOUBLE_EQ(opts.at("gradient_clipping").get<double>(), 1.0);

  const auto fsdp = dir.write("fsdp.yaml", R"(distributed_type: FSDP
fsdp_config:
  fsdp_sharding_strategy: SHARD_GRAD_OP
  fsdp_offload_params: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_version: 1
strategy_options:
  offload_params: true
num_processes: 2
)");
  o.config_file = fsdp;
  c = hasten::resolve_config(o, clean_env(dir.path()));
  EXPECT_EQ(c.strategy, "fsdp");
  opts = nlohmann::json::parse(c.strategy_options);
  EXPECT_EQ(opts.at("sharding_strategy"), "SHARD_GRAD_OP");
  EXPECT_EQ(opts.at("offload_params"), true);  // strategy_options win over fsdp_config
  EXPECT_EQ(opts.at("transformer_layer_cls_to_wrap"), "Block");

  const auto cpu = dir.write("cpu.yaml", "distributed_type: MULTI_CPU\nnum_processes: 2\n");
  o.config_file = cpu;
  EXPECT_EQ(hasten::resolve_config(o, clean_env(dir.path())).strategy, "ddp");
}

TEST(Config, SeveralProcessesWithoutConfigUseDdp) {
  hasten::test::TempDir dir;
  Environment env = clean_env(dir.path());
  env["WORLD_SIZE"] = "2";
  env["RANK"] = "1";
  EXPECT_EQ(hasten::resolve_config({}, env).strategy, "ddp");
  Environment slurm = clean_env(dir.path());  // srun: no WORLD_SIZE at all
  slurm.insert({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}});
  EXPECT_EQ(hasten::resolve_config({}, slurm).strategy, "ddp");
  Options o;
  o.strategy = "single";
  EXPECT_EQ(hasten::resolve_config(o, env).strategy, "single");
}

TEST(Config, CodeSetTakesAnyKey) {
  hasten::test::TempDir dir;
  Options o;
  o.set = {{"deepspeed_config.zero_stage", "2"}, {"distributed_type", "DEEPSPEED"}, {"trackers", "[csv, jsonl]"}};
  Config c = hasten::resolve_config(o, clean_env(dir.path()));
  EXPECT_EQ(c.strategy, "zero");
  EXPECT_EQ(nlohmann::json::parse(c.strategy_options).at("stage"), 2);
  EXPECT_EQ(c.trackers, (std::vector<std::string>{"csv", "jsonl"}));
}

TEST(Config, LogWithSelectsTheTrackers) {
  hasten::test::TempDir dir;
  Environment env = clean_env(dir.path());
  env["HASTEN_LOG_WITH"] = "tensorboard,mlflow";
  Config c = hasten::resolve_config({}, env);
  EXPECT_EQ(c.trackers, (std::vector<std::string>{"tensorboard", "mlflow"}));

  // A file may say it both ways when the lists agree.
  Options o;
  o.config_file = dir.write("both.yaml", "log_with: [csv, jsonl]\ntrackers: [csv, jsonl]\n");
  c = hasten::resolve_config(o, clean_env(dir.path()));
  EXPECT_EQ(c.trackers, (std::vector<std::string>{"csv", "jsonl"}));

  o.config_file = dir.write("all.yaml", "log_with: all\n");
  c = hasten::resolve_config(o, clean_env(dir.path()));
  EXPECT_EQ(c.trackers, (std::vector<std::string>{"all"}));  // expanded by init_trackers
}

TEST(ConfigErrors, LogWithAndTrackersNamingDifferentTrackers) {
  hasten::test::TempDir dir;
  Options o;
  o.config_file = dir.write("t.yaml", "trackers: [csv]\n");
  o.set = {{"log_with", "[jsonl]"}};
  const std::string e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("log_with [jsonl]"), std::string::npos) << e;
  EXPECT_NE(e.find("trackers [csv] (file "), std::string::npos) << e;
  EXPECT_NE(e.find("set one of them"), std::string::npos) << e;
}

TEST(ConfigErrors, MalformedYamlNamesTheLine) {
  hasten::test::TempDir dir;
  Options o;
  o.config_file = dir.write("bad.yaml", "mixed_precision: bf16\nnum_processes: [1, 2\n");
  const std::string e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("malformed YAML at line"), std::string::npos) << e;
  EXPECT_NE(e.find("bad.yaml"), std::string::npos) << e;
}

TEST(ConfigErrors, UnknownKeySuggestsTheNearMatch) {
  hasten::test::TempDir dir;
  Options o;
  o.config_file = dir.write("c.yaml", "mixed_precison: bf16\n");
  std::string e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("unknown key 'mixed_precison'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'mixed_precision'"), std::string::npos) << e;

  o.config_file = dir.write("n.yaml", "fsdp_config:\n  fsdp_sharding_stratgy: FULL_SHARD\n");
  e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("did you mean 'fsdp_config.fsdp_sharding_strategy'"), std::string::npos) << e;
}

TEST(ConfigErrors, StrategyOptionsAreCheckedAgainstThePluginsDescription) {
  hasten::test::TempDir dir;
  Options o;
  o.set = {{"strategy", "zero"}, {"strategy_options", "{stag: 2}"}};
  std::string e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("zero options: unknown key 'stag'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'stage'?"), std::string::npos) << e;
  o.set = {{"distributed_type", "DEEPSPEED"}, {"deepspeed_config.zero_stage", "4"}};
  e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("deepspeed_config.zero_stage: 4 is out of range (allowed: 0 to 3)"), std::string::npos) << e;
  // The environment reaches a plugin's section too, and a misspelt variable is named.
  Environment env = clean_env(dir.path());
  env["HASTEN_DISTRIBUTED_TYPE"] = "FSDP";
  env["HASTEN_FSDP_CONFIG__FSDP_SHARDING_STRATEGY"] = "shard_grad_op";
  Config c = hasten::resolve_config({}, env);
  EXPECT_EQ(c.strategy, "fsdp");
  EXPECT_EQ(nlohmann::json::parse(c.strategy_options).at("sharding_strategy"), "SHARD_GRAD_OP");
  env["HASTEN_FSDP_CONFIG__FSDP_SHARDING_STRATEGI"] = "FULL_SHARD";
  e = error_of({}, env);
  EXPECT_NE(e.find("did you mean 'HASTEN_FSDP_CONFIG__FSDP_SHARDING_STRATEGY'"), std::string::npos) << e;
  // Section keys that only set a run setting stay out of the strategy's options.
  o.set = {{"distributed_type", "DEEPSPEED"}, {"deepspeed_config.gradient_accumulation_steps", "4"}};
  c = hasten::resolve_config(o, clean_env(dir.path()));
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(nlohmann::json::parse(c.strategy_options), nlohmann::json::object());
  // Only the selected strategy's section sets run settings: another one left in a file sets none.
  o.set = {{"strategy", "ddp"}, {"fsdp_config.fsdp_activation_checkpointing", "true"},
           {"deepspeed_config.gradient_accumulation_steps", "4"}};
  c = hasten::resolve_config(o, clean_env(dir.path()));
  EXPECT_FALSE(c.activation_checkpointing);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  o.set = {{"strategy", "fsdp"}, {"fsdp_config.fsdp_activation_checkpointing", "true"}};
  c = hasten::resolve_config(o, clean_env(dir.path()));
  EXPECT_TRUE(c.activation_checkpointing);
  o.set.emplace_back("activation_checkpointing", "false");
  const std::string disagree = error_of(o, clean_env(dir.path()));
  EXPECT_NE(disagree.find("activation_checkpointing is false"), std::string::npos) << disagree;
}

TEST(ConfigErrors, WrongTypeBadEnumAndRange) {
  hasten::test::TempDir dir;
  Options o;
  o.config_file = dir.write("t.yaml", "num_processes: two\n");
  std::string e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("num_processes: expected an integer, got 'two'"), std::string::npos) << e;

  o.config_file = dir.write("e.yaml", "mixed_precision: fp8\n");
  e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("mixed_precision: 'fp8' is not allowed (allowed: no, fp16, bf16)"), std::string::npos) << e;

  o.config_file = dir.write("r.yaml", "num_processes: 0\n");
  e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("num_processes: 0 is out of range (allowed: >= 1)"), std::string::npos) << e;

  o.config_file = dir.write("b.yaml", "use_cpu: maybe\n");
  e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("use_cpu: expected a boolean"), std::string::npos) << e;

  o.config_file = dir.write("d.yaml", "distributed_type: MULTI_GPUS\n");
  e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("did you mean 'MULTI_GPU'"), std::string::npos) << e;
}

TEST(ConfigErrors, EnvironmentAndCode) {
  hasten::test::TempDir dir;
  Environment env = clean_env(dir.path());
  env["HASTEN_MIXED_PRECISON"] = "bf16";
  std::string e = error_of({}, env);
  EXPECT_NE(e.find("'HASTEN_MIXED_PRECISON' is not a hasten setting"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'HASTEN_MIXED_PRECISION'"), std::string::npos) << e;

  env = clean_env(dir.path());
  env["HASTEN_NUM_PROCESSES"] = "-1";
  e = error_of({}, env);
  EXPECT_NE(e.find("environment HASTEN_NUM_PROCESSES"), std::string::npos) << e;

  Options o;
  o.set = {{"gradient_acumulation_steps", "2"}};
  e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("did you mean 'gradient_accumulation_steps'"), std::string::npos) << e;

  Options m;
  m.mixed_precision = "fp32";
  e = error_of(m, clean_env(dir.path()));
  EXPECT_NE(e.find("code options: mixed_precision: 'fp32' is not allowed"), std::string::npos) << e;
}

TEST(ConfigErrors, FilesAndCrossKeyChecks) {
  hasten::test::TempDir dir;
  Options o;
  o.config_file = (dir.path() / "missing.yaml").string();
  EXPECT_NE(error_of(o, clean_env(dir.path())).find("does not exist"), std::string::npos);

  o.config_file = dir.write("m.yaml", "num_machines: 2\nmachine_rank: 2\nnum_processes: 4\n");
  EXPECT_NE(error_of(o, clean_env(dir.path())).find("machine_rank 2"), std::string::npos);

  o.config_file = dir.write("g.yaml",
                            "gradient_accumulation_steps: 2\ndistributed_type: DEEPSPEED\n"
                            "deepspeed_config:\n  gradient_accumulation_steps: 4\n");
  EXPECT_NE(error_of(o, clean_env(dir.path())).find("set one of them"), std::string::npos);

  o.config_file = dir.write("top.yaml", "- a\n- b\n");
  EXPECT_NE(error_of(o, clean_env(dir.path())).find("expected a mapping of keys at the top level"),
            std::string::npos);
}

TEST(Config, DocsListEveryKey) {
  std::ifstream in(std::string(HASTEN_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md is missing";
  std::stringstream text;
  text << in.rdbuf();
  for (const auto& row : hasten::config_key_table()) {
    const std::string key = row.substr(0, row.find('\t'));
    EXPECT_NE(text.str().find("`" + key + "`"), std::string::npos) << "docs/config.md does not list " << key;
  }
}

TEST(Config, CommNamesABackendPerDeviceType) {
  hasten::test::TempDir dir;
  Config c = hasten::resolve_config({}, clean_env(dir.path()));
  EXPECT_EQ(c.comm, "auto");
  EXPECT_TRUE(c.comm_backends.empty() || c.comm_backends.at("cpu") == "auto");
  Options o;
  o.set = {{"comm", "gloo"}};
  c = hasten::resolve_config(o, clean_env(dir.path()));
  EXPECT_EQ(c.comm, "gloo");
  EXPECT_EQ(c.comm_backends.at("cpu"), "gloo");
  o.set = {{"comm", "{cpu: shm, cuda: nccl}"}};
  c = hasten::resolve_config(o, clean_env(dir.path()));
  EXPECT_EQ(c.comm, "shm");
  EXPECT_EQ(c.comm_backends.at("cuda"), "nccl");
  auto env = clean_env(dir.path());
  env["HASTEN_COMM"] = "{cuda: mybackend}";
  c = hasten::resolve_config({}, env);
  EXPECT_EQ(c.comm, "auto");
  EXPECT_EQ(c.comm_backends.at("cuda"), "mybackend");
  o.set = {{"comm", "{cpu: shm, tpu: x}"}};
  const std::string e = error_of(o, clean_env(dir.path()));
  EXPECT_NE(e.find("unknown device type 'tpu' (allowed: cpu, cuda)"), std::string::npos) << e;
  o.set = {{"comm", "{cpu: [a, b]}"}};
  EXPECT_NE(error_of(o, clean_env(dir.path())).find("comm.cpu"), std::string::npos);
}

TEST(Config, CommOptionsGoToTheCpuBackendOrPerDeviceType) {
  hasten::test::TempDir dir;
  auto env = clean_env(dir.path());
  env["HASTEN_COMM_OPTIONS"] = "{buffer_mb: 2}";  // flat: the CPU backend's, as before
  Config c = hasten::resolve_config({}, env);
  EXPECT_EQ(nlohmann::json::parse(c.comm_options), nlohmann::json::parse(R"({"buffer_mb": 2})"));
  EXPECT_EQ(c.comm_options_by_device.count("cuda"), 0u);
  env["HASTEN_COMM_OPTIONS"] = "{cpu: {buffer_mb: 3}, cuda: {nccl_opt: x}}";
  c = hasten::resolve_config({}, env);
  EXPECT_EQ(nlohmann::json::parse(c.comm_options), nlohmann::json::parse(R"({"buffer_mb": 3})"));
  EXPECT_EQ(nlohmann::json::parse(c.comm_options_by_device.at("cuda")), nlohmann::json::parse(R"({"nccl_opt": "x"})"));
  env["HASTEN_COMM_OPTIONS"] = "{cuda: {a: 1}}";  // no CPU options: the CPU backend gets none
  c = hasten::resolve_config({}, env);
  EXPECT_EQ(c.comm_options, "{}");
  env["HASTEN_COMM_OPTIONS"] = "{cpu: {buffer_mb: 3}, buffer_mb: 4}";
  std::string e = error_of({}, env);
  EXPECT_NE(e.find("comm_options"), std::string::npos) << e;
  EXPECT_NE(e.find("mixes device types"), std::string::npos) << e;
  env["HASTEN_COMM_OPTIONS"] = "{cuda: 5}";
  e = error_of({}, env);
  EXPECT_NE(e.find("comm_options.cuda"), std::string::npos) << e;
}

TEST(Config, DispatchBatchesIsUnsetUntilASourceSetsIt) {
  // Unset, each loader decides by its kind (Accelerate's None: on for stream datasets).
  hasten::test::TempDir dir;
  EXPECT_FALSE(hasten::resolve_config({}, clean_env(dir.path())).dispatch_batches.has_value());
  auto env = clean_env(dir.path());
  env["HASTEN_DISPATCH_BATCHES"] = "false";
  EXPECT_EQ(hasten::resolve_config({}, env).dispatch_batches, std::optional<bool>(false));
  Options o;
  o.dispatch_batches = true;  // code over the environment
  EXPECT_EQ(hasten::resolve_config(o, env).dispatch_batches, std::optional<bool>(true));
  o = {};
  o.config_file = dir.write("d.yaml", "dispatch_batches: true\n");
  EXPECT_EQ(hasten::resolve_config(o, clean_env(dir.path())).dispatch_batches, std::optional<bool>(true));
  env["HASTEN_DISPATCH_BATCHES"] = "sometimes";
  const std::string e = error_of({}, env);
  EXPECT_NE(e.find("dispatch_batches"), std::string::npos) << e;
}
