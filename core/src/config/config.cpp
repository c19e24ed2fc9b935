// Configuration: the layers (defaults < file < environment < code), merged and checked, and
// the plugin selections derived from Accelerate's keys through what the strategy plugins
// declare. The key schema is in config_schema.cpp, the sources in config_sources.cpp.
#include <hasten/config.hpp>
#include <hasten/error.hpp>
#include <hasten/registry.hpp>

#include <nlohmann/json.hpp>

#include <pwd.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "config/config_file_readers.hpp"
#include "config/config_schema.hpp"
#include "config/config_sources.hpp"
#include "config/described_options.hpp"
#include "config/parallelism_config.hpp"
#include "config/profile_config.hpp"
#include "config/strategy_vocabulary.hpp"
#include "util/text_util.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace hasten {

using namespace detail;  // NOLINT: this file is the front of the detail config files

namespace {

std::string get_str(const json& v, const std::string& k) { return v.at(k).get<std::string>(); }

// Rebuilds a nested JSON object from dotted keys.
json nest(const json& flat) {
  json out = json::object();
  for (auto it = flat.begin(); it != flat.end(); ++it) {
    json* node = &out;
    std::stringstream ss(it.key());
    std::string part, next;
    std::getline(ss, part, '.');
    while (std::getline(ss, next, '.')) {
      node = &(*node)[part];
      part = next;
    }
    (*node)[part] = it.value();
  }
  return out;
}

// The last value a layer gives `key` (before merging: plugin_path and strategy decide which
// plugins, and so which keys, exist).
json last_value(const std::vector<Layer>& layers, const std::string& key) {
  json v;
  for (auto& layer : layers)
    if (layer.values.contains(key)) v = layer.values.at(key);
  return v;
}

// hasten's keys and the loaded strategies' sections. A strategy selected by path has its
// section too.
struct FullSchema {
  Schema keys;
  StrategyVocabulary vocabulary;
};

FullSchema full_schema(const std::vector<Layer>& layers) {
  auto& registry = PluginRegistry::instance();
  const json dirs = last_value(layers, "plugin_path");
  if (dirs.is_array()) registry.add_search_directories(dirs.get<std::vector<std::string>>());
  std::vector<PluginInfo> plugins = registry.plugins();
  const json strategy = last_value(layers, "strategy");
  if (strategy.is_string()) {
    try {
      const PluginSelection s = registry.select(PluginKind::Strategy, strategy.get<std::string>());
      bool listed = false;
      for (auto& p : plugins) listed = listed || (p.kind == PluginKind::Strategy && p.name == s.info->name);
      if (!listed) plugins.push_back(*s.info);
    } catch (const Error&) {  // an unknown strategy is reported where the run creates it
    }
  }
  FullSchema full;
  full.vocabulary = strategy_vocabulary(plugins);
  full.keys = core_schema();
  for (auto& k : full.keys)
    if (k.path == "distributed_type")
      for (auto& entry : full.vocabulary.by_distributed_type) k.choices.push_back(entry.first);
  full.keys.insert(full.keys.end(), full.vocabulary.rows.begin(), full.vocabulary.rows.end());
  return full;
}

// The config file: a strategy's own format (a DeepSpeed JSON) when a strategy's reader
// recognizes it, else hasten's YAML.
Layer config_file_layer(const std::string& path) {
  if (auto native = read_native_config(path))
    return tree_layer(native->values, "file " + path,
                      native->format + " file '" + path + "' (read by strategy " + native->strategy + ")",
                      native->format + " file " + path);
  return file_layer(path);
}

// A key such as deepspeed_config.deepspeed_config_file names a file in the format of the
// section's strategy: its reader translates it and the keys join the layer that named it,
// just below it; a key both set to different values is an error. The key goes no further.
void route_section_files(std::vector<Layer>& layers, const FullSchema& full) {
  for (const auto& [strategy, section] : full.vocabulary.section_of) {
    const std::string file_key = reader_section_key(strategy);
    if (file_key.empty()) continue;
    const std::string key = section + "." + file_key;
    for (size_t i = 0; i < layers.size(); ++i) {
      if (!layers[i].values.contains(key)) continue;
      const std::string file = layers[i].values.at(key).get<std::string>();
      const std::string named_by = layers[i].origin[key];
      layers[i].values.erase(key);
      layers[i].origin.erase(key);
      const NativeConfig native = read_strategy_config_file(strategy, file, key + " (" + named_by + ")");
      Layer extra = tree_layer(native.values, native.format + " " + file, native.format + " file '" + file + "'",
                               native.format + " file " + file + " (named by " + named_by + ")");
      resolve_pending(extra, full.keys);
      for (auto it = extra.values.begin(); it != extra.values.end(); ++it)
        if (layers[i].values.contains(it.key()) && layers[i].values.at(it.key()) != it.value())
          throw ConfigError("config error: " + it.key() + " is " + show(layers[i].values.at(it.key())) + " (" +
                            layers[i].origin[it.key()] + ") but " + show(it.value()) + " in " + native.format +
                            " file '" + file + "'; set it in one place");
      layers.insert(layers.begin() + static_cast<std::ptrdiff_t>(i), std::move(extra));
      ++i;
    }
  }
}

Config finish(std::vector<Layer> layers, const std::string& config_file, const Environment& env) {
  const FullSchema full = full_schema(layers);
  const Schema& schema = full.keys;
  for (auto& layer : layers) resolve_pending(layer, schema);
  route_section_files(layers, full);

  // Merge: later layers win; Map values merge key by key.
  json merged = json::object();
  std::map<std::string, std::string> origin;
  for (auto& k : schema) {
    if (k.type == KeyType::Section || k.def.is_null()) continue;
    merged[k.path] = k.def;
    origin[k.path] = "default";
  }
  json explicit_values = json::object();
  for (auto& layer : layers) {
    for (auto it = layer.values.begin(); it != layer.values.end(); ++it) {
      const KeySpec* spec = find_spec(schema, it.key());
      if (spec->type == KeyType::Map && merged.contains(it.key()) && merged[it.key()].is_object()) {
        merged[it.key()].merge_patch(it.value());
        explicit_values[it.key()] = merged[it.key()];
      } else {
        merged[it.key()] = it.value();
        explicit_values[it.key()] = it.value();
      }
      origin[it.key()] = layer.origin[it.key()];
    }
  }
  auto has = [&](const std::string& k) { return merged.contains(k); };
  auto was_set = [&](const std::string& k) { return origin.count(k) && origin[k] != "default"; };
  auto where = [&](const std::string& k) { return origin.count(k) ? origin[k] : "default"; };

  Config c;
  c.config_file = config_file;
  // distributed_type takes the values the loaded strategies answer to.
  if (const KeySpec* dt = find_spec(schema, "distributed_type"); !dt->choices.empty())
    merged["distributed_type"] = convert(*dt, merged["distributed_type"], where("distributed_type"));
  c.distributed_type = get_str(merged, "distributed_type");
  c.mixed_precision = get_str(merged, "mixed_precision");
  c.num_processes = merged["num_processes"].get<int>();
  c.num_machines = merged["num_machines"].get<int>();
  c.machine_rank = merged["machine_rank"].get<int>();
  c.main_process_ip = get_str(merged, "main_process_ip");
  c.main_process_port = merged["main_process_port"].get<int>();
  c.gradient_accumulation_steps = merged["gradient_accumulation_steps"].get<int>();
  c.use_cpu = merged["use_cpu"].get<bool>();
  c.debug = merged["debug"].get<bool>();
  c.gpu_ids = get_str(merged, "gpu_ids");
  try {
    parse_gpu_ids(c.gpu_ids);  // a malformed list is an error wherever the run goes
  } catch (const ConfigError& e) {
    throw ConfigError(std::string("config error: ") + e.what() + " (" + where("gpu_ids") + ")");
  }
  {
    json comm = merged["comm"];
    // From the environment a mapping arrives as text: HASTEN_COMM='{cpu: gloo}'.
    if (comm.is_string() && !comm.get<std::string>().empty() && comm.get<std::string>().front() == '{') {
      comm = yaml_text_to_json(comm.get<std::string>(), "comm (" + where("comm") + ")");
    }
    auto backend = [&](const std::string& device, const json& v) {
      if (!v.is_string() || v.get<std::string>().empty())
        throw ConfigError("config error: comm." + device + " (" + where("comm") + "): expected a plugin name, a path or auto, got '" +
                          show(v) + "'");
      c.comm_backends[device] = v.get<std::string>();
    };
    if (comm.is_object()) {
      for (auto it = comm.begin(); it != comm.end(); ++it) {
        if (it.key() != "cpu" && it.key() != "cuda")
          throw ConfigError("config error: comm (" + where("comm") + "): unknown device type '" + it.key() +
                            "' (allowed: cpu, cuda)");
        backend(it.key(), it.value());
      }
    } else {
      backend("cpu", comm);
    }
    c.comm = c.comm_backends.count("cpu") ? c.comm_backends["cpu"] : "auto";
  }
  c.project_dir = get_str(merged, "project_dir");
  c.logging_dir = get_str(merged, "logging_dir");
  c.automatic_checkpoint_naming = merged["automatic_checkpoint_naming"].get<bool>();
  c.total_limit = merged["total_limit"].get<int>();
  c.save_on_each_node = merged["save_on_each_node"].get<bool>();
  c.resume = merged["resume"].get<std::string>();
  if (c.resume.empty())
    throw ConfigError("config error: resume (" + where("resume") +
                      ") is empty; allowed: no, auto or a checkpoint directory");
  c.timeout_s = merged["timeout_s"].get<double>();
  c.rendezvous_timeout_s = merged["rendezvous_timeout_s"].get<double>();
  c.log_level = get_str(merged, "log_level");
  c.step_scheduler_with_optimizer = merged["step_scheduler_with_optimizer"].get<bool>();
  c.split_batches = merged["split_batches"].get<bool>();
  c.even_batches = merged["even_batches"].get<bool>();
  if (merged.contains("dispatch_batches") && !merged["dispatch_batches"].is_null())
    c.dispatch_batches = merged["dispatch_batches"].get<bool>();
  c.sync_each_batch = merged["sync_each_batch"].get<bool>();
  c.activation_checkpointing = merged["activation_checkpointing"].get<bool>();
  c.sharded_init = merged["sharded_init"].get<bool>();
  c.sync_with_dataloader = merged["sync_with_dataloader"].get<bool>();
  c.short_window_loss_division = get_str(merged, "short_window_loss_division");
  c.scheduler_steps_per_process = merged["scheduler_steps_per_process"].get<bool>();
  c.adjust_scheduler = merged["adjust_scheduler"].get<bool>();
  // adjust_scheduler bumps the step count Accelerate's AcceleratedScheduler bounds a schedule
  // with; hasten's own schedule (once per optimizer step) has no such bound, so the key would
  // do nothing there: refused rather than silently ignored.
  if (was_set("adjust_scheduler") && !c.scheduler_steps_per_process)
    throw ConfigError("config error: adjust_scheduler (" + where("adjust_scheduler") +
                      ") applies only with scheduler_steps_per_process: true (Accelerate's scheduler arithmetic, "
                      "whose step bound it adjusts); hasten's default schedule steps once per optimizer step and "
                      "has no bound to adjust: set scheduler_steps_per_process: true, or remove adjust_scheduler");
  // dynamo_config: TorchDynamo (torch.compile) compiles Python; a LibTorch C++ module runs as
  // it is. Accelerate's default backend (NO) is accepted; a backend is refused, not ignored.
  if (merged.contains("dynamo_config") && merged["dynamo_config"].is_object() &&
      merged["dynamo_config"].contains("dynamo_backend")) {
    const json& b = merged["dynamo_config"]["dynamo_backend"];
    if (!b.is_null() && !(b.is_string() && to_lower(b.get<std::string>()) == "no"))
      throw ConfigError("config error: dynamo_config.dynamo_backend (" + where("dynamo_config") + "): '" + show(b) +
                        "' is not supported (allowed: NO): torch.compile (TorchDynamo) compiles Python code, and "
                        "hasten runs LibTorch's C++ modules as they are");
  }
  c.pad_out_of_range_dim = get_str(merged, "pad_out_of_range_dim");
  c.num_cpu_threads_per_process = merged["num_cpu_threads_per_process"].get<int>();
  c.max_restarts = merged["max_restarts"].get<int>();
  c.tee = merged["tee"].get<bool>();
  c.log_dir = get_str(merged, "log_dir");
  for (auto& t : merged["trackers"]) c.trackers.push_back(t.get<std::string>());
  // log_with (Accelerate's Accelerator argument) names the same list as trackers: either
  // selects the trackers; both set to different lists leaves no honest choice.
  if (was_set("log_with")) {
    std::vector<std::string> log_with;
    for (auto& t : merged["log_with"]) log_with.push_back(t.get<std::string>());
    if (was_set("trackers") && log_with != c.trackers)
      throw ConfigError("config error: log_with [" + join(log_with, ", ") + "] (" + where("log_with") +
                        ") and trackers [" + join(c.trackers, ", ") + "] (" + where("trackers") +
                        ") name different trackers; set one of them (they are the same setting)");
    c.trackers = log_with;
  }
  for (auto& t : merged["plugin_path"]) c.plugin_path.push_back(t.get<std::string>());
  c.precision_options = merged["precision_options"].dump();
  c.tracker_options = merged["tracker_options"].dump();
  c.profile = parse_profile(merged["profile"], "profile (" + where("profile") + ")");
  c.parallelism = parse_parallelism(merged["parallelism_config"], "parallelism_config (" + where("parallelism_config") + ")");
  c.trackers_in_process = merged["trackers_in_process"].get<bool>();
  {
    // Keyed by device type when any key is one (the shape of `comm`); otherwise the whole
    // mapping belongs to the CPU backend, as before per-device options existed.
    const json& o = merged["comm_options"];
    bool by_device = false, flat = false;
    for (auto it = o.begin(); it != o.end(); ++it) (it.key() == "cpu" || it.key() == "cuda" ? by_device : flat) = true;
    if (by_device && flat)
      throw ConfigError("config error: comm_options (" + where("comm_options") +
                        ") mixes device types (cpu, cuda) with option names; give either the CPU backend's options "
                        "or a mapping per device type: {cpu: {...}, cuda: {...}}");
    if (by_device) {
      for (auto it = o.begin(); it != o.end(); ++it) {
        if (!it.value().is_object())
          throw ConfigError("config error: comm_options." + it.key() + " (" + where("comm_options") +
                            "): expected a mapping of the " + it.key() + " backend's options, got '" + show(it.value()) + "'");
        c.comm_options_by_device[it.key()] = it.value().dump();
      }
    } else {
      c.comm_options_by_device["cpu"] = o.dump();
    }
    c.comm_options = c.comm_options_by_device.count("cpu") ? c.comm_options_by_device["cpu"] : "{}";
  }

  // Cross-key checks.
  if (c.machine_rank >= c.num_machines)
    throw ConfigError("config error: machine_rank " + std::to_string(c.machine_rank) + " (" +
                      where("machine_rank") + ") must be below num_machines " +
                      std::to_string(c.num_machines));
  if (c.num_processes % c.num_machines != 0)
    throw ConfigError("config error: num_processes " + std::to_string(c.num_processes) +
                      " must be a multiple of num_machines " + std::to_string(c.num_machines) +
                      " (processes per machine are equal)");
  // Accelerate's NO means one process; with more, the launcher would start several workers
  // that the strategy NO selects treats as one. An explicit strategy settles it either way.
  if (was_set("distributed_type") && c.distributed_type == "NO" && c.num_processes > 1 && !was_set("strategy"))
    throw ConfigError("config error: distributed_type NO (" + where("distributed_type") +
                      ") runs one process but num_processes is " + std::to_string(c.num_processes) + " (" +
                      where("num_processes") + "); set distributed_type to MULTI_CPU (or another "
                      "multi-process type) or num_processes to 1");
  // A section key that also sets a run setting (DeepSpeed's gradient_accumulation_steps)
  // must agree with the top-level key when both are set.
  // Strategy: explicit, else the one that answers to distributed_type; a program started as
  // several processes (hasten launch, torchrun, srun, mpirun) with no say in the matter
  // trains data-parallel, as Accelerate does: the strategy that answers to MULTI_CPU.
  const auto& answers = full.vocabulary.by_distributed_type;
  if (has("strategy")) {
    c.strategy = get_str(merged, "strategy");
  } else {
    if (auto it = answers.find(c.distributed_type); it != answers.end()) c.strategy = it->second;
    int world = 1;
    try {
      world = detect_process_info(env).world_size;
    } catch (const ConfigError&) {  // reported where the run starts
    }
    if (!was_set("distributed_type") && world > 1 && answers.count("MULTI_CPU")) c.strategy = answers.at("MULTI_CPU");
  }
  // The strategy's config section (Accelerate's names) becomes its options; strategy_options
  // win. A preset or a path selects the section of the plugin behind it.
  const PluginInfo* strategy_info = nullptr;
  PluginSelection selected;
  try {
    selected = PluginRegistry::instance().select(PluginKind::Strategy, c.strategy);
    strategy_info = selected.info;
  } catch (const Error&) {  // an unknown strategy is reported where the run creates it
  }
  // Run settings a section key of the selected strategy sets (FSDP's
  // fsdp_activation_checkpointing, DeepSpeed's gradient_accumulation_steps): a top-level value
  // set apart from it must agree. Another strategy's section left in a file sets nothing.
  auto of_strategy = [&](const KeySpec& row) { return strategy_info != nullptr && row.strategy == strategy_info->name; };
  for (auto& [setting, field] : {std::pair<std::string, bool*>{"activation_checkpointing", &c.activation_checkpointing},
                                  std::pair<std::string, bool*>{"sharded_init", &c.sharded_init}}) {
    for (auto& row : full.vocabulary.rows) {
      if (row.run_setting != setting || !has(row.path) || !of_strategy(row)) continue;
      const bool value = merged[row.path].get<bool>();
      if (was_set(setting) && value != *field)
        throw ConfigError("config error: " + setting + " is " + (*field ? "true" : "false") + " (" + where(setting) +
                          ") but " + row.path + " is " + (value ? "true" : "false") + " (" + where(row.path) +
                          "); set one of them");
      *field = value;
    }
  }
  for (auto& row : full.vocabulary.rows) {
    if (row.run_setting != "gradient_accumulation_steps" || !has(row.path) || !of_strategy(row)) continue;
    const int value = merged[row.path].get<int>();
    if (was_set("gradient_accumulation_steps") && value != c.gradient_accumulation_steps)
      throw ConfigError("config error: gradient_accumulation_steps is " + std::to_string(c.gradient_accumulation_steps) +
                        " (" + where("gradient_accumulation_steps") + ") but " + row.path + " is " +
                        std::to_string(value) + " (" + where(row.path) + "); set one of them");
    c.gradient_accumulation_steps = value;
  }

  json strategy_options = json::object();
  if (strategy_info != nullptr) {
    for (auto& row : full.vocabulary.rows)
      if (row.strategy == strategy_info->name && !row.option.empty() && has(row.path))
        strategy_options[row.option] = merged[row.path];
  }
  strategy_options.merge_patch(merged["strategy_options"]);
  if (strategy_info != nullptr)
    if (const std::string why = described_options_error(*strategy_info, strategy_options); !why.empty())
      throw ConfigError("config error: strategy options (" + where("strategy_options") + "): " + why);
  c.strategy_options = strategy_options.dump();
  c.precision = has("precision") ? get_str(merged, "precision") : c.mixed_precision;

  c.origin = origin;
  json resolved = merged;
  resolved["strategy"] = c.strategy;
  resolved["strategy_options"] = strategy_options;
  resolved["precision"] = c.precision;
  if (!was_set("strategy")) c.origin["strategy"] = "derived from distributed_type";
  if (!was_set("precision")) c.origin["precision"] = "derived from mixed_precision";
  c.resolved_json = nest(resolved).dump();
  c.explicit_json = nest(explicit_values).dump();
  return c;
}

}  // namespace

std::string Config::effective_logging_dir() const {
  if (!logging_dir.empty()) return logging_dir;
  return (fs::path(project_dir) / "hasten_logs").string();
}

std::string default_config_path(const Environment& env) {
  auto get = [&](const char* k) -> std::string {
    auto it = env.find(k);
    return it == env.end() ? "" : it->second;
  };
  fs::path home;
  if (!get("HASTEN_HOME").empty())
    home = get("HASTEN_HOME");
  else if (!get("XDG_CONFIG_HOME").empty())
    home = fs::path(get("XDG_CONFIG_HOME")) / "hasten";
  else if (!get("HOME").empty())
    home = fs::path(get("HOME")) / ".config" / "hasten";
  else if (const passwd* pw = ::getpwuid(::geteuid()); pw != nullptr && pw->pw_dir != nullptr && *pw->pw_dir != '\0')
    home = fs::path(pw->pw_dir) / ".config" / "hasten";  // HOME unset: the user's own, never the working directory
  else
    return "";
  return (home / "default_config.yaml").string();
}

Config resolve_config(const Options& code, const Environment& env) {
  std::vector<Layer> layers;
  std::string file;
  const bool from_launcher = env.count("HASTEN_CONFIG_JSON") && !env.at("HASTEN_CONFIG_JSON").empty();
  if (code.config_file) {
    file = *code.config_file;
  } else if (env.count("HASTEN_CONFIG_FILE") && !env.at("HASTEN_CONFIG_FILE").empty()) {
    file = env.at("HASTEN_CONFIG_FILE");
  } else if (!from_launcher) {
    std::error_code ec;
    const std::string def = default_config_path(env);
    if (!def.empty() && fs::exists(def, ec)) file = def;
  }
  // The launcher's HASTEN_CONFIG_JSON already holds the file it read: reading a file again
  // would let a default file's keys leak into a run launched with another one.
  if (!file.empty() && (!from_launcher || code.config_file)) layers.push_back(config_file_layer(file));
  layers.push_back(env_layer(env));
  layers.push_back(code_layer(code));
  return finish(std::move(layers), file, env);
}

Config load_config_file(const std::string& path) {
  std::vector<Layer> layers;
  layers.push_back(config_file_layer(path));
  return finish(std::move(layers), path, {});
}

std::vector<ConfigKeyInfo> config_keys() {
  std::vector<ConfigKeyInfo> keys;
  const FullSchema full = full_schema({});
  for (auto& k : full.keys) {
    ConfigKeyInfo info;
    info.key = k.path;
    info.type = short_type(k.type);
    info.default_text = k.def.is_null() ? "" : show(k.def);
    info.choices = k.choices;
    info.min = k.min;
    info.max = k.max;
    info.allowed = join(k.choices, ", ");
    auto bound = [&](double d) {
      return k.type == KeyType::Int ? std::to_string(static_cast<long long>(d)) : show(json(d));
    };
    if (k.min && k.max)
      info.allowed = bound(*k.min) + " to " + bound(*k.max);
    else if (k.min && k.type == KeyType::Int)
      info.allowed = ">= " + std::to_string(static_cast<long long>(*k.min));
    info.env = k.type == KeyType::Section ? "" : env_name(k.path);
    info.doc = k.doc;
    keys.push_back(std::move(info));
  }
  return keys;
}

std::vector<std::string> config_key_table() {
  std::vector<std::string> rows;
  for (const auto& k : config_keys())
    rows.push_back(k.key + "\t" + k.type + "\t" + k.default_text + "\t" + k.allowed + "\t" + k.env + "\t" + k.doc);
  return rows;
}

std::string default_config_yaml(const std::string& mixed_precision) {
  const KeySpec* mp = find_spec(core_schema(), "mixed_precision");
  const std::string value = convert(*mp, mixed_precision, "flag").get<std::string>();
  std::ostringstream out;
  out << "# hasten configuration (Accelerate-compatible keys); docs/config.md lists every key.\n"
      << "compute_environment: LOCAL_MACHINE\n"
      // No distributed_type: the number of processes decides (one: single, several: the
      // MULTI_CPU strategy), so `hasten launch --num_processes 2` works with this file.
      << "mixed_precision: '" << value << "'\n"
      << "num_processes: 1\n"
      << "num_machines: 1\n"
      << "machine_rank: 0\n"
      << "main_process_port: 29500\n"
      << "gradient_accumulation_steps: 1\n"
      << "use_cpu: true\n"
      << "debug: false\n"
      << "trackers: [csv]\n";
  return out.str();
}

}  // namespace hasten
