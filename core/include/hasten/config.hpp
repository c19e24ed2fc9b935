// hasten's configuration: one resolved, validated view of the run's settings.
//
// Sources, lowest to highest precedence: built-in defaults, the config file
// (Options::config_file, else HASTEN_CONFIG_FILE, else the default file written by
// `hasten config default`), the environment (HASTEN_CONFIG_JSON set by `hasten launch`, then
// one HASTEN_<KEY> variable per key), then options given in code. The file accepts
// Accelerate's config keys (distributed_type, mixed_precision, fsdp_config.*,
// deepspeed_config.*, ...) and hasten's own (strategy, precision, trackers, ...).
// docs/config.md lists every key. Unknown keys and bad values throw ConfigError naming the
// key, the value, what is allowed and, where there is one, a near match.
#pragma once

#include <hasten/process.hpp>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hasten {

// Accelerate's ParallelismConfig (config key `parallelism_config`, or Options::parallelism_config):
// the sizes of the run's device mesh, whose dimensions are, outermost first, dp_replicate,
// dp_shard, cp and tp (tp's ranks adjacent). Their product is the number of processes; all 1
// (the default) is a mesh of dp_replicate over every process, as Accelerate makes it
// (device_mesh.hpp).
struct ParallelismConfig {
  int dp_replicate_size = 1;
  int dp_shard_size = 1;
  int tp_size = 1;
  int cp_size = 1;  // only 1 until context parallelism exists
};

// Options given in code: the highest-precedence layer. Unset fields leave the lower layers'
// values; `set` takes any key by its dotted path ("fsdp_config.fsdp_sharding_strategy") with
// its value written as in YAML ("FULL_SHARD", "4", "[csv, jsonl]").
struct Options {
  std::optional<std::string> config_file;
  std::optional<std::string> mixed_precision;
  std::optional<int> gradient_accumulation_steps;
  std::optional<std::string> strategy;
  std::optional<std::string> precision;
  std::optional<std::vector<std::string>> trackers;
  std::optional<std::string> project_dir;
  std::optional<std::string> logging_dir;
  std::optional<bool> automatic_checkpoint_naming;
  std::optional<int> total_limit;
  std::optional<bool> save_on_each_node;  // Accelerate's ProjectConfiguration.save_on_each_node
  std::optional<std::string> resume;
  std::optional<bool> cpu;
  std::optional<bool> step_scheduler_with_optimizer;
  std::optional<bool> split_batches;
  std::optional<bool> even_batches;
  std::optional<bool> dispatch_batches;
  // Gradient accumulation (Accelerate's GradientAccumulationPlugin).
  std::optional<bool> sync_each_batch;
  std::optional<bool> sync_with_dataloader;
  // Accelerate's arithmetic where hasten departs from it (docs/api.md, "Departures").
  std::optional<std::string> short_window_loss_division;  // "window" (hasten) or "steps"
  std::optional<bool> scheduler_steps_per_process;
  std::optional<bool> adjust_scheduler;  // Accelerate's, under scheduler_steps_per_process
  std::optional<std::string> pad_out_of_range_dim;  // "error" (hasten) or "unchanged"
  std::optional<ParallelismConfig> parallelism_config;  // config key parallelism_config
  std::vector<std::pair<std::string, std::string>> set;
  // How messages name these options: "code" ("code option mixed_precision") or "flag"
  // ("flag --mixed_precision", for command-line tools).
  std::string origin = "code";
};

// Config key `profile`: LibTorch's profiler over a window of optimizer steps, one Chrome trace
// per rank (core/src/engine/profiling.cpp). Steps count from 0: the window records steps
// wait + warmup to wait + warmup + active - 1; the warmup steps start the profiler and are
// dropped, as torch.profiler.schedule's.
struct ProfileSettings {
  bool enabled = false;  // the key (or any of its fields) was given
  int wait = 0;
  int warmup = 1;
  int active = 3;
  std::string dir;  // "" -> <project_dir>/profile
};

// The resolved configuration.
struct Config {
  // Accelerate's keys.
  std::string distributed_type = "NO";
  std::string mixed_precision = "no";
  int num_processes = 1;
  int num_machines = 1;
  int machine_rank = 0;
  std::string main_process_ip = "127.0.0.1";
  int main_process_port = 29500;
  int gradient_accumulation_steps = 1;
  bool use_cpu = false;
  bool debug = false;
  std::string gpu_ids = "all";  // "all" or a comma list of GPU ordinals (select_cuda_device)

  // Plugins, resolved: a plugin name, a preset name or a path to a plugin library, and the
  // options handed to its create() as a JSON object.
  std::string strategy = "single";
  std::string strategy_options = "{}";
  std::string precision = "no";
  std::string precision_options = "{}";
  std::vector<std::string> trackers;
  std::string tracker_options = "{}";  // JSON object keyed by tracker name
  bool trackers_in_process = false;    // false: each tracker in a host process of its own
  std::string comm = "auto";  // the CPU backend (comm_backends["cpu"] or auto)
  // Config key `comm` per device type ("cpu", "cuda"): a plugin name, a path or "auto"; a
  // device type not listed is auto.
  std::map<std::string, std::string> comm_backends;
  // Config key `comm_options`: the CPU backend's options (a flat mapping), or options per
  // device type ({cpu: {...}, cuda: {...}}), the shape of `comm`. By device type, as JSON
  // objects; comm_options is the CPU backend's.
  std::string comm_options = "{}";
  std::map<std::string, std::string> comm_options_by_device;
  std::vector<std::string> plugin_path;  // extra plugin directories, searched last

  // Run settings.
  std::string project_dir = ".";
  std::string logging_dir;  // "" -> <project_dir>/hasten_logs
  bool automatic_checkpoint_naming = false;  // save_state(dir) ignores dir: checkpoints/checkpoint_N
  int total_limit = 0;                       // automatic checkpoints kept (0: all)
  bool save_on_each_node = false;  // each machine's local main writes a whole checkpoint there
  std::string resume = "no";  // "no", "auto" or a checkpoint directory (checkpoint_load.cpp)
  double timeout_s = 1800.0;             // every collective wait
  double rendezvous_timeout_s = 300.0;   // rendezvous, store calls, comm connection set-up
  std::string log_level = "info";
  bool step_scheduler_with_optimizer = true;
  bool split_batches = false;
  bool even_batches = true;
  // Rank 0 reads each prepared loader and broadcasts the batches; unset: on for stream
  // datasets, off for map-style ones (Accelerate's default).
  std::optional<bool> dispatch_batches;
  // Gradient accumulation: reduce gradients on every micro-batch (the optimizer still steps
  // every N-th), and close the window at the loader's last batch.
  bool sync_each_batch = false;
  // Activation checkpointing of every prepared model's outermost units (unit.hpp).
  bool activation_checkpointing = false;
  // Models built without their full weights: from the Accelerator's construction to its first
  // prepare, each hasten::Unit keeps only this rank's shard once constructed (stage 3).
  bool sharded_init = false;
  ProfileSettings profile;
  ParallelismConfig parallelism;
  bool sync_with_dataloader = true;
  // Departures from Accelerate, each with Accelerate's arithmetic as an option.
  std::string short_window_loss_division = "window";  // "steps": divide by N, as Accelerate
  bool scheduler_steps_per_process = false;  // true: num_processes steps unless split_batches
  // Under scheduler_steps_per_process: step() on an accumulation micro-batch bumps the count
  // that bounds a schedule with total_steps() (Accelerate's GradientAccumulationPlugin).
  bool adjust_scheduler = true;
  std::string pad_out_of_range_dim = "error";  // "unchanged": return the tensor, as Accelerate
  int num_cpu_threads_per_process = 0;  // 0: cores / local processes
  int max_restarts = 0;  // hasten launch: restarts of all workers after a failure
  bool tee = false;
  std::string log_dir;

  // Provenance.
  std::string config_file;                    // the file that was read, "" if none
  std::map<std::string, std::string> origin;  // dotted key -> "file F", "env V", "code"...
  std::string explicit_json;  // only the keys some source set, as JSON (for the launcher)
  std::string resolved_json;  // every key with its value, as JSON

  std::string effective_logging_dir() const;
};

// The default config file: $HASTEN_HOME/default_config.yaml, where HASTEN_HOME defaults to
// $XDG_CONFIG_HOME/hasten or ~/.config/hasten (~: HOME, else the user's home directory from the
// password database). "" when there is no home at all: no default file, never one in the
// working directory.
std::string default_config_path(const Environment& env);

// Resolves the configuration from every source. Throws ConfigError.
Config resolve_config(const Options& code, const Environment& env);
inline Config resolve_config(const Options& code = {}) {
  return resolve_config(code, current_environment());
}

// Reads and validates one config file on its own (no other sources). Throws ConfigError.
Config load_config_file(const std::string& path);

// One config key as the schema describes it: the one definition that `hasten config keys`,
// docs/config.md (checked by a test), `hasten launch`'s flags and the questionnaire read.
struct ConfigKeyInfo {
  std::string key;                   // dotted: "mixed_precision", "fsdp_config.fsdp_sharding_strategy"
  std::string type;                  // bool, int, float, string, enum, list, map, section, any
  std::string default_text;          // as a message shows it; "" when the key has no default
  std::vector<std::string> choices;  // enum: the values allowed
  std::optional<double> min, max;    // int, float: the bounds
  std::string allowed;               // what is allowed, in words ("0 to 65535", "no, fp16, bf16")
  std::string env;                   // HASTEN_<KEY>; "" for a section
  std::string doc;                   // one line
};

// Every key: hasten's, Accelerate's and the installed strategies' section keys.
std::vector<ConfigKeyInfo> config_keys();

// One line per schema key: "key\ttype\tdefault\tallowed\tenvironment\tdescription" (docs and CLI).
std::vector<std::string> config_key_table();

// The default config file written by `hasten config default` (YAML text).
std::string default_config_yaml(const std::string& mixed_precision);

}  // namespace hasten
