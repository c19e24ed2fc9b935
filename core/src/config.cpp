// Configuration: the key schema, the layers (defaults < file < environment < code), their
// validation and the derivation of plugin selections from Accelerate's keys.
#include <hasten/config.hpp>
#include <hasten/error.hpp>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "text_util.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace hasten {

namespace {

enum class Type { Bool, Int, Float, String, Enum, StringList, Map, Section, Any };

struct KeySpec {
  std::string path;
  Type type;
  json def;  // null: no default (unset)
  std::vector<std::string> choices;
  std::optional<double> min;
  std::optional<double> max;
  std::string doc;
  bool ignored = false;  // accepted for Accelerate compatibility; no effect in hasten
};

const std::vector<KeySpec>& schema() {
  using T = Type;
  static const std::vector<KeySpec> keys = {
      // ---- Accelerate's keys --------------------------------------------------------------
      {"compute_environment", T::Enum, "LOCAL_MACHINE", {"LOCAL_MACHINE"}, {}, {},
       "Where the run executes; only LOCAL_MACHINE (Accelerate's AMAZON_SAGEMAKER is not supported)"},
      {"distributed_type", T::Enum, "NO", {"NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED"}, {}, {},
       "Selects the strategy when `strategy` is not set: NO -> single, MULTI_CPU/MULTI_GPU -> ddp, "
       "FSDP -> fsdp, DEEPSPEED -> zero"},
      {"mixed_precision", T::Enum, "no", {"no", "fp16", "bf16"}, {}, {},
       "Selects the precision plugin when `precision` is not set"},
      {"use_cpu", T::Bool, false, {}, {}, {}, "Train on the CPU even where a GPU is present"},
      {"debug", T::Bool, false, {}, {}, {},
       "Check that every rank enters the same collective with the same shapes (env HASTEN_DEBUG)"},
      {"num_processes", T::Int, 1, {}, 1.0, {}, "Total processes across all machines"},
      {"num_machines", T::Int, 1, {}, 1.0, {}, "Machines in the run"},
      {"machine_rank", T::Int, 0, {}, 0.0, {}, "This machine's index, 0..num_machines-1"},
      {"main_process_ip", T::String, "127.0.0.1", {}, {}, {}, "Address of the machine of rank 0"},
      {"main_process_port", T::Int, 29500, {}, 0.0, 65535.0,
       "Rendezvous port on the main machine (0: pick a free one, one machine only)"},
      {"rdzv_backend", T::Enum, "static", {"static"}, {}, {}, "Rendezvous kind; hasten uses static rendezvous"},
      {"same_network", T::Bool, true, {}, {}, {}, "Accepted for Accelerate compatibility", true},
      {"gpu_ids", T::String, "all", {}, {}, {}, "GPUs this machine uses: all, or a comma list such as 0,1"},
      {"gradient_accumulation_steps", T::Int, 1, {}, 1.0, {},
       "Micro-batches per optimizer step (inside accumulate())"},
      {"main_training_function", T::String, json(), {}, {}, {}, "Accepted for Accelerate compatibility", true},
      {"downcast_bf16", T::String, json(), {}, {}, {}, "Accepted for Accelerate compatibility (TPU)", true},
      {"enable_cpu_affinity", T::Bool, false, {}, {}, {}, "Accepted for Accelerate compatibility", true},
      {"tpu_name", T::String, json(), {}, {}, {}, "Accepted for Accelerate compatibility (TPU)", true},
      {"tpu_zone", T::String, json(), {}, {}, {}, "Accepted for Accelerate compatibility (TPU)", true},
      {"tpu_use_cluster", T::Bool, json(), {}, {}, {}, "Accepted for Accelerate compatibility (TPU)", true},
      {"tpu_use_sudo", T::Bool, json(), {}, {}, {}, "Accepted for Accelerate compatibility (TPU)", true},
      {"tpu_vm", T::Any, json(), {}, {}, {}, "Accepted for Accelerate compatibility (TPU)", true},
      {"tpu_env", T::Any, json(), {}, {}, {}, "Accepted for Accelerate compatibility (TPU)", true},
      {"command_file", T::String, json(), {}, {}, {}, "Accepted for Accelerate compatibility (TPU)", true},
      {"commands", T::Any, json(), {}, {}, {}, "Accepted for Accelerate compatibility (TPU)", true},
      {"dynamo_config", T::Map, json(), {}, {}, {}, "Accepted for Accelerate compatibility (torch.compile has no C++ counterpart)", true},
      {"fp8_config", T::Map, json(), {}, {}, {}, "Accepted for Accelerate compatibility (fp8 is not supported)", true},
      {"mpirun_config", T::Map, json(), {}, {}, {}, "Accepted for Accelerate compatibility (hasten launch starts CPU workers itself)", true},
      {"parallelism_config", T::Map, json(), {}, {}, {}, "Accepted for Accelerate compatibility", true},
      {"megatron_lm_config", T::Map, json(), {}, {}, {}, "Accepted for Accelerate compatibility", true},

      {"fsdp_config", T::Section, json(), {}, {}, {}, "Options of the fsdp strategy (Accelerate's names)"},
      {"fsdp_config.fsdp_version", T::Int, json(), {}, 1.0, 2.0, "1 or 2 (both map to hasten's fsdp)"},
      {"fsdp_config.fsdp_sharding_strategy", T::Enum, json(),
       {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"}, {}, {},
       "What is sharded"},
      {"fsdp_config.fsdp_reshard_after_forward", T::Any, json(), {}, {}, {},
       "true/false, or a sharding strategy name (FSDP1 files)"},
      {"fsdp_config.fsdp_offload_params", T::Bool, json(), {}, {}, {}, "Parameters and optimizer step on the CPU"},
      {"fsdp_config.fsdp_auto_wrap_policy", T::Enum, json(),
       {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"}, {}, {}, "How units are chosen"},
      {"fsdp_config.fsdp_transformer_layer_cls_to_wrap", T::String, json(), {}, {}, {},
       "Comma list of module names that become units"},
      {"fsdp_config.fsdp_min_num_params", T::Int, json(), {}, 0.0, {}, "SIZE_BASED_WRAP threshold"},
      {"fsdp_config.fsdp_backward_prefetch", T::Enum, json(),
       {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"}, {}, {}, "Gather the next unit during backward"},
      {"fsdp_config.fsdp_forward_prefetch", T::Bool, json(), {}, {}, {}, "Gather the next unit during forward"},
      {"fsdp_config.fsdp_state_dict_type", T::Enum, json(),
       {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"}, {}, {}, "Checkpoint layout"},
      {"fsdp_config.fsdp_use_orig_params", T::Bool, json(), {}, {}, {}, "Accepted; hasten always keeps original parameters"},
      {"fsdp_config.fsdp_cpu_ram_efficient_loading", T::Bool, json(), {}, {}, {}, "Only rank 0 materialises weights"},
      {"fsdp_config.fsdp_sync_module_states", T::Bool, json(), {}, {}, {}, "Broadcast rank 0's weights at prepare"},
      {"fsdp_config.fsdp_activation_checkpointing", T::Bool, json(), {}, {}, {}, "Recompute unit activations in backward"},
      {"fsdp_config.fsdp_ignored_modules", T::String, json(), {}, {}, {}, "Regex of modules left unsharded"},

      {"deepspeed_config", T::Section, json(), {}, {}, {}, "Options of the zero strategy (Accelerate's names)"},
      {"deepspeed_config.deepspeed_config_file", T::String, json(), {}, {}, {}, "A DeepSpeed JSON file"},
      {"deepspeed_config.zero_stage", T::Int, json(), {}, 0.0, 3.0, "0 (plain data parallel) to 3"},
      {"deepspeed_config.offload_optimizer_device", T::Enum, json(), {"none", "cpu", "nvme"}, {}, {},
       "Where optimizer state and step live"},
      {"deepspeed_config.offload_param_device", T::Enum, json(), {"none", "cpu", "nvme"}, {}, {},
       "Where parameters live between uses (stage 3)"},
      {"deepspeed_config.offload_optimizer_nvme_path", T::String, json(), {}, {}, {}, "NVMe swap directory"},
      {"deepspeed_config.offload_param_nvme_path", T::String, json(), {}, {}, {}, "NVMe swap directory"},
      {"deepspeed_config.gradient_accumulation_steps", T::Int, json(), {}, 1.0, {},
       "Must agree with gradient_accumulation_steps when both are set"},
      {"deepspeed_config.gradient_clipping", T::Float, json(), {}, 0.0, {}, "Global gradient-norm clip"},
      {"deepspeed_config.zero3_save_16bit_model", T::Bool, json(), {}, {}, {}, "Accepted; hasten always gathers full weights on save"},
      {"deepspeed_config.zero3_init_flag", T::Bool, json(), {}, {}, {}, "Build stage-3 models already partitioned"},
      {"deepspeed_config.deepspeed_moe_layer_cls_names", T::String, json(), {}, {}, {}, "Accepted for compatibility", true},
      {"deepspeed_config.deepspeed_multinode_launcher", T::String, json(), {}, {}, {}, "Accepted for compatibility", true},
      {"deepspeed_config.deepspeed_hostfile", T::String, json(), {}, {}, {}, "Accepted for compatibility", true},
      {"deepspeed_config.deepspeed_exclusion_filter", T::String, json(), {}, {}, {}, "Accepted for compatibility", true},
      {"deepspeed_config.deepspeed_inclusion_filter", T::String, json(), {}, {}, {}, "Accepted for compatibility", true},

      // ---- hasten's keys --------------------------------------------------------------------
      {"strategy", T::String, json(), {}, {}, {},
       "Strategy plugin: a name (single, ddp, fsdp, zero), a preset, or a path to a plugin library"},
      {"strategy_options", T::Map, json::object(), {}, {}, {}, "Options handed to the strategy plugin"},
      {"precision", T::String, json(), {}, {}, {},
       "Precision plugin: a name (no, bf16, fp16) or a path; defaults to mixed_precision"},
      {"precision_options", T::Map, json::object(), {}, {}, {},
       "Options of the precision plugin (fp16: init_scale, growth_factor, backoff_factor, growth_interval)"},
      {"trackers", T::StringList, json::array(), {}, {}, {},
       "Tracker plugins that init_trackers starts (names or paths), e.g. [csv, jsonl]"},
      {"tracker_options", T::Map, json::object(), {}, {}, {}, "Per-tracker options keyed by tracker name"},
      {"comm", T::Any, "auto", {}, {}, {},
       "Comm backend per device type: a name or path for CPU tensors, or a mapping {cpu: X, cuda: Y}; "
       "auto picks the serving plugin of highest priority that fits the run"},
      {"comm_options", T::Map, json::object(), {}, {}, {}, "Options of the comm plugin"},
      {"plugin_path", T::StringList, json::array(), {}, {}, {}, "Extra plugin directories, searched last"},
      {"project_dir", T::String, ".", {}, {}, {}, "Base directory of the run's outputs"},
      {"logging_dir", T::String, "", {}, {}, {}, "Tracker output directory (default <project_dir>/hasten_logs)"},
      {"timeout_s", T::Float, 1800.0, {}, 0.001, {}, "Deadline of rendezvous and of every collective wait"},
      {"log_level", T::Enum, "info", {"trace", "debug", "info", "warn", "error", "off"}, {}, {}, "hasten's log level"},
      {"step_scheduler_with_optimizer", T::Bool, true, {}, {}, {},
       "Prepared schedulers step once per real optimizer step (false: on every call)"},
      {"split_batches", T::Bool, false, {}, {}, {},
       "The loader's batch size is the global batch, split across processes"},
      {"even_batches", T::Bool, true, {}, {}, {},
       "Pad the last round so every process gets the same number of full batches"},
      {"num_cpu_threads_per_process", T::Int, 0, {}, 0.0, {}, "Intra-op threads per worker (0: cores / local workers)"},
      {"tee", T::Bool, false, {}, {}, {}, "hasten launch also writes each rank's output to log_dir"},
      {"log_dir", T::String, "", {}, {}, {}, "Where hasten launch writes per-rank logs"},
  };
  return keys;
}

const KeySpec* find_spec(const std::string& path) {
  for (auto& k : schema())
    if (k.path == path) return &k;
  return nullptr;
}

std::vector<std::string> child_keys(const std::string& parent) {
  std::vector<std::string> out;
  for (auto& k : schema()) {
    const auto dot = k.path.rfind('.');
    const std::string p = dot == std::string::npos ? "" : k.path.substr(0, dot);
    if (p == parent) out.push_back(k.path);
  }
  return out;
}

std::string env_name(const std::string& path) {
  std::string out = "HASTEN_";
  for (size_t i = 0; i < path.size(); ++i) {
    const char c = path[i];
    if (c == '.')
      out += "__";
    else
      out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return out;
}

std::string type_name(Type t) {
  switch (t) {
    case Type::Bool: return "a boolean (true or false)";
    case Type::Int: return "an integer";
    case Type::Float: return "a number";
    case Type::String: return "a string";
    case Type::Enum: return "one of a set of names";
    case Type::StringList: return "a list of strings";
    case Type::Map: return "a mapping";
    case Type::Section: return "a mapping";
    case Type::Any: return "any value";
  }
  return "a value";
}

std::string short_type(Type t) {
  switch (t) {
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "string";
    case Type::Enum: return "enum";
    case Type::StringList: return "list";
    case Type::Map: return "map";
    case Type::Section: return "section";
    case Type::Any: return "any";
  }
  return "?";
}

std::string show(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// Scalars of YAML become typed JSON; quoted scalars stay strings.
json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return nullptr;
    case YAML::NodeType::Sequence: {
      json arr = json::array();
      for (const auto& item : node) arr.push_back(yaml_to_json(item));
      return arr;
    }
    case YAML::NodeType::Map: {
      json obj = json::object();
      for (const auto& kv : node) obj[kv.first.Scalar()] = yaml_to_json(kv.second);
      return obj;
    }
    case YAML::NodeType::Scalar: break;
  }
  const std::string s = node.Scalar();
  if (node.Tag() == "!") return s;  // quoted: a string, whatever it looks like
  const std::string l = detail::to_lower(s);
  if (l == "true") return true;
  if (l == "false") return false;
  if (l == "~" || l == "null") return nullptr;
  char* end = nullptr;
  errno = 0;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (!s.empty() && end && *end == '\0' && errno == 0) return i;
  const double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && end && *end == '\0') return d;
  return s;
}

// A source's label, used in every message about it.
struct Layer {
  std::string label;   // "file X", "environment", "code"
  json values = json::object();  // dotted key -> value (validated)
  std::map<std::string, std::string> origin;  // dotted key -> where exactly
};

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw ConfigError("config error: " + where + ": " + what);
}

std::optional<bool> parse_bool(const std::string& s) {
  const std::string l = detail::to_lower(detail::trim(s));
  if (l == "true" || l == "yes" || l == "on" || l == "1") return true;
  if (l == "false" || l == "no" || l == "off" || l == "0") return false;
  return std::nullopt;
}

// Converts and checks a value against its key's spec. `v` may be typed or a string (from
// the environment or YAML).
json convert(const KeySpec& spec, const json& v, const std::string& where) {
  const std::string& key = spec.path;
  auto wrong = [&]() -> json {
    fail(where, key + ": expected " + type_name(spec.type) + ", got '" + show(v) + "'");
  };
  auto range = [&](double x) {
    if ((spec.min && x < *spec.min) || (spec.max && x > *spec.max)) {
      std::string allowed;
      auto num = [](double d) {
        std::ostringstream o;
        o << d;
        return o.str();
      };
      if (spec.min && spec.max)
        allowed = num(*spec.min) + " to " + num(*spec.max);
      else if (spec.min)
        allowed = ">= " + num(*spec.min);
      else
        allowed = "<= " + num(*spec.max);
      fail(where, key + ": " + show(v) + " is out of range (allowed: " + allowed + ")");
    }
  };
  switch (spec.type) {
    case Type::Bool: {
      if (v.is_boolean()) return v;
      if (v.is_string()) {
        if (auto b = parse_bool(v.get<std::string>())) return *b;
      }
      if (v.is_number_integer() && (v.get<long long>() == 0 || v.get<long long>() == 1))
        return v.get<long long>() == 1;
      return wrong();
    }
    case Type::Int: {
      long long i = 0;
      if (v.is_number_integer()) {
        i = v.get<long long>();
      } else if (v.is_string()) {
        const std::string s = detail::trim(v.get<std::string>());
        char* end = nullptr;
        errno = 0;
        i = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || errno != 0) return wrong();
      } else {
        return wrong();
      }
      range(static_cast<double>(i));
      return i;
    }
    case Type::Float: {
      double d = 0;
      if (v.is_number()) {
        d = v.get<double>();
      } else if (v.is_string()) {
        const std::string s = detail::trim(v.get<std::string>());
        char* end = nullptr;
        d = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0') return wrong();
      } else {
        return wrong();
      }
      if (!std::isfinite(d)) return wrong();
      range(d);
      return d;
    }
    case Type::String: {
      if (v.is_string()) return v;
      if (v.is_number() || v.is_boolean()) return v.dump();
      return wrong();
    }
    case Type::Enum: {
      if (!v.is_string()) {
        fail(where, key + ": '" + show(v) + "' is not allowed (allowed: " +
                        detail::join(spec.choices, ", ") + ")");
      }
      const std::string s = detail::trim(v.get<std::string>());
      for (auto& c : spec.choices)
        if (detail::to_lower(c) == detail::to_lower(s)) return c;
      std::string msg = key + ": '" + s + "' is not allowed (allowed: " +
                        detail::join(spec.choices, ", ") + ")";
      const std::string near = detail::nearest(s, spec.choices);
      if (!near.empty()) msg += "; did you mean '" + near + "'?";
      fail(where, msg);
    }
    case Type::StringList: {
      json out = json::array();
      if (v.is_string()) {
        std::stringstream ss(v.get<std::string>());
        std::string item;
        while (std::getline(ss, item, ',')) {
          item = detail::trim(item);
          if (!item.empty()) out.push_back(item);
        }
        return out;
      }
      if (!v.is_array()) return wrong();
      for (auto& item : v) {
        if (!item.is_string())
          fail(where, key + ": expected a list of strings, got item '" + show(item) + "'");
        out.push_back(item);
      }
      return out;
    }
    case Type::Map: {
      if (v.is_object()) return v;
      if (v.is_string()) {  // from the environment: JSON or YAML text
        json parsed;
        try {
          parsed = yaml_to_json(YAML::Load(v.get<std::string>()));
        } catch (const std::exception&) {
          return wrong();
        }
        if (parsed.is_object()) return parsed;
      }
      return wrong();
    }
    case Type::Section:
    case Type::Any: return v;
  }
  return v;
}

// Adds `value` (a JSON tree with keys relative to `prefix`) to the layer, validating each key.
void absorb(Layer& layer, const std::string& prefix, const json& value, const std::string& where,
            const std::string& origin) {
  if (!value.is_object()) {
    if (prefix.empty()) fail(where, "expected a mapping of keys at the top level");
    fail(where, prefix + ": expected a mapping, got '" + show(value) + "'");
  }
  for (auto it = value.begin(); it != value.end(); ++it) {
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    const KeySpec* spec = find_spec(path);
    if (spec == nullptr) {
      std::vector<std::string> siblings = child_keys(prefix);
      std::string msg = "unknown key '" + path + "'";
      const std::string near = detail::nearest(path, siblings);
      if (!near.empty()) msg += " (did you mean '" + near + "'?)";
      fail(where, msg);
    }
    if (it.value().is_null()) continue;  // Accelerate writes None as an absent key
    if (spec->type == Type::Section) {
      absorb(layer, path, it.value(), where, origin);
      continue;
    }
    layer.values[path] = convert(*spec, it.value(), where);
    layer.origin[path] = origin;
  }
}

Layer file_layer(const std::string& path) {
  const std::string where = "file '" + path + "'";
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ConfigError("config error: config file '" + path + "' does not exist");
  if (fs::is_directory(path, ec)) throw ConfigError("config error: config file '" + path + "' is a directory");
  std::ifstream in(path);
  if (!in) throw ConfigError("config error: cannot read config file '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    fail(where, "malformed YAML at line " + std::to_string(e.mark.line + 1) + ", column " +
                    std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  Layer layer;
  layer.label = "file " + path;
  if (root.IsNull()) return layer;  // an empty file sets nothing
  absorb(layer, "", yaml_to_json(root), where, "file " + path);
  return layer;
}

bool reserved_env(const std::string& name) {
  static const std::vector<std::string> reserved = {
      "HASTEN_CONFIG_FILE", "HASTEN_CONFIG_JSON", "HASTEN_PLUGIN_PATH", "HASTEN_HOME",
      "HASTEN_LAUNCHED",    "HASTEN_TEST_",       "HASTEN_BENCH_"};
  for (auto& r : reserved)
    if (name == r || (r.back() == '_' && name.rfind(r, 0) == 0)) return true;
  return false;
}

Layer env_layer(const Environment& env) {
  Layer layer;
  layer.label = "environment";
  if (auto it = env.find("HASTEN_CONFIG_JSON"); it != env.end() && !it->second.empty()) {
    json parsed = json::parse(it->second, nullptr, false);
    if (parsed.is_discarded())
      throw ConfigError("config error: environment HASTEN_CONFIG_JSON: not valid JSON");
    // Nested JSON: its own keys, validated like a file.
    absorb(layer, "", parsed, "environment HASTEN_CONFIG_JSON", "launcher (HASTEN_CONFIG_JSON)");
  }
  std::vector<std::string> known;
  for (auto& k : schema())
    if (k.type != Type::Section) known.push_back(env_name(k.path));
  for (auto& [name, value] : env) {
    if (name.rfind("HASTEN_", 0) != 0 || reserved_env(name)) continue;
    const KeySpec* spec = nullptr;
    for (auto& k : schema())
      if (k.type != Type::Section && env_name(k.path) == name) spec = &k;
    const std::string where = "environment " + name;
    if (spec == nullptr) {
      std::string msg = "'" + name + "' is not a hasten setting";
      const std::string near = detail::nearest(name, known);
      if (!near.empty()) msg += " (did you mean '" + near + "'?)";
      throw ConfigError("config error: environment: " + msg);
    }
    if (value.empty()) continue;
    layer.values[spec->path] = convert(*spec, value, where);
    layer.origin[spec->path] = "env " + name;
  }
  return layer;
}

Layer code_layer(const Options& o) {
  Layer layer;
  layer.label = "code";
  auto where_of = [&](const std::string& key) {
    (void)key;  // messages name the key themselves
    return o.origin == "flag" ? std::string("command-line flags") : o.origin + " options";
  };
  auto put = [&](const std::string& key, const json& v) {
    layer.values[key] = convert(*find_spec(key), v, where_of(key));
    layer.origin[key] = o.origin;
  };
  if (o.mixed_precision) put("mixed_precision", *o.mixed_precision);
  if (o.gradient_accumulation_steps) put("gradient_accumulation_steps", *o.gradient_accumulation_steps);
  if (o.strategy) put("strategy", *o.strategy);
  if (o.precision) put("precision", *o.precision);
  if (o.trackers) put("trackers", *o.trackers);
  if (o.project_dir) put("project_dir", *o.project_dir);
  if (o.logging_dir) put("logging_dir", *o.logging_dir);
  if (o.cpu) put("use_cpu", *o.cpu);
  if (o.step_scheduler_with_optimizer) put("step_scheduler_with_optimizer", *o.step_scheduler_with_optimizer);
  if (o.split_batches) put("split_batches", *o.split_batches);
  if (o.even_batches) put("even_batches", *o.even_batches);
  for (auto& [key, text] : o.set) {
    const KeySpec* spec = find_spec(key);
    const std::string where = where_of(key);
    if (spec == nullptr || spec->type == Type::Section) {
      std::vector<std::string> all;
      for (auto& k : schema()) all.push_back(k.path);
      std::string msg = "unknown key '" + key + "'";
      const std::string near = detail::nearest(key, all);
      if (!near.empty()) msg += " (did you mean '" + near + "'?)";
      fail(where, msg);
    }
    json value;
    try {
      value = yaml_to_json(YAML::Load(text));
    } catch (const YAML::Exception& e) {
      fail(where, "malformed value '" + text + "': " + e.msg);
    }
    if (value.is_null()) continue;
    layer.values[key] = convert(*spec, value, where);
    layer.origin[key] = o.origin;
  }
  return layer;
}

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
  else
    home = fs::path(get("HOME").empty() ? "." : get("HOME")) / ".config" / "hasten";
  return (home / "default_config.yaml").string();
}

namespace {

Config finish(std::vector<Layer> layers, const std::string& config_file, const Environment& env) {
  // Merge: later layers win; Map values merge key by key.
  json merged = json::object();
  std::map<std::string, std::string> origin;
  for (auto& k : schema()) {
    if (k.type == Type::Section || k.def.is_null()) continue;
    merged[k.path] = k.def;
    origin[k.path] = "default";
  }
  json explicit_values = json::object();
  for (auto& layer : layers) {
    for (auto it = layer.values.begin(); it != layer.values.end(); ++it) {
      const KeySpec* spec = find_spec(it.key());
      if (spec->type == Type::Map && merged.contains(it.key()) && merged[it.key()].is_object()) {
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
  {
    json comm = merged["comm"];
    // From the environment a mapping arrives as text: HASTEN_COMM='{cpu: gloo}'.
    if (comm.is_string() && !comm.get<std::string>().empty() && comm.get<std::string>().front() == '{') {
      try {
        comm = yaml_to_json(YAML::Load(comm.get<std::string>()));
      } catch (const YAML::Exception& e) {
        throw ConfigError("config error: comm (" + where("comm") + "): malformed mapping: " + e.msg);
      }
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
  c.timeout_s = merged["timeout_s"].get<double>();
  c.log_level = get_str(merged, "log_level");
  c.step_scheduler_with_optimizer = merged["step_scheduler_with_optimizer"].get<bool>();
  c.split_batches = merged["split_batches"].get<bool>();
  c.even_batches = merged["even_batches"].get<bool>();
  c.num_cpu_threads_per_process = merged["num_cpu_threads_per_process"].get<int>();
  c.tee = merged["tee"].get<bool>();
  c.log_dir = get_str(merged, "log_dir");
  for (auto& t : merged["trackers"]) c.trackers.push_back(t.get<std::string>());
  for (auto& t : merged["plugin_path"]) c.plugin_path.push_back(t.get<std::string>());
  c.precision_options = merged["precision_options"].dump();
  c.tracker_options = merged["tracker_options"].dump();
  c.comm_options = merged["comm_options"].dump();

  // Cross-key checks.
  if (c.machine_rank >= c.num_machines)
    throw ConfigError("config error: machine_rank " + std::to_string(c.machine_rank) + " (" +
                      where("machine_rank") + ") must be below num_machines " +
                      std::to_string(c.num_machines));
  if (c.num_processes % c.num_machines != 0)
    throw ConfigError("config error: num_processes " + std::to_string(c.num_processes) +
                      " must be a multiple of num_machines " + std::to_string(c.num_machines) +
                      " (processes per machine are equal)");
  if (has("deepspeed_config.gradient_accumulation_steps")) {
    const int ds = merged["deepspeed_config.gradient_accumulation_steps"].get<int>();
    if (was_set("gradient_accumulation_steps") && ds != c.gradient_accumulation_steps)
      throw ConfigError("config error: gradient_accumulation_steps is " +
                        std::to_string(c.gradient_accumulation_steps) + " (" +
                        where("gradient_accumulation_steps") +
                        ") but deepspeed_config.gradient_accumulation_steps is " +
                        std::to_string(ds) + " (" + where("deepspeed_config.gradient_accumulation_steps") +
                        "); set one of them");
    c.gradient_accumulation_steps = ds;
  }

  // Strategy: explicit, else from distributed_type, else (several processes) ddp.
  json strategy_options = json::object();
  if (has("strategy")) {
    c.strategy = get_str(merged, "strategy");
  } else {
    const std::string& t = c.distributed_type;
    if (t == "MULTI_CPU" || t == "MULTI_GPU")
      c.strategy = "ddp";
    else if (t == "FSDP")
      c.strategy = "fsdp";
    else if (t == "DEEPSPEED")
      c.strategy = "zero";
    else {
      c.strategy = "single";
      // A program started as several processes (hasten launch, torchrun, srun, mpirun) with
      // no say in the matter trains data-parallel, as Accelerate does.
      int world = 1;
      try {
        world = detect_process_info(env).world_size;
      } catch (const ConfigError&) {  // reported where the run starts
      }
      if (!was_set("distributed_type") && world > 1) c.strategy = "ddp";
    }
  }
  // Accelerate's nested options become the strategy's options (strategy_options win).
  const std::string section = c.strategy == "fsdp" ? "fsdp_config." : c.strategy == "zero" ? "deepspeed_config." : "";
  if (!section.empty()) {
    for (auto it = merged.begin(); it != merged.end(); ++it) {
      if (it.key().rfind(section, 0) != 0) continue;
      std::string name = it.key().substr(section.size());
      if (section == "fsdp_config." && name.rfind("fsdp_", 0) == 0) name = name.substr(5);
      if (section == "deepspeed_config." && name == "zero_stage") name = "stage";
      const KeySpec* spec = find_spec(it.key());
      if (spec && !spec->ignored) strategy_options[name] = it.value();
    }
  }
  strategy_options.merge_patch(merged["strategy_options"]);
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
    if (fs::exists(def, ec)) file = def;
  }
  // The launcher's HASTEN_CONFIG_JSON already holds the file it read: reading a file again
  // would let a default file's keys leak into a run launched with another one.
  if (!file.empty() && (!from_launcher || code.config_file)) layers.push_back(file_layer(file));
  layers.push_back(env_layer(env));
  layers.push_back(code_layer(code));
  return finish(std::move(layers), file, env);
}

Config load_config_file(const std::string& path) {
  std::vector<Layer> layers;
  layers.push_back(file_layer(path));
  return finish(std::move(layers), path, {});
}

std::vector<std::string> config_key_table() {
  std::vector<std::string> rows;
  for (auto& k : schema()) {
    std::string allowed = detail::join(k.choices, ", ");
    if (k.min && k.max)
      allowed = std::to_string(static_cast<long long>(*k.min)) + " to " +
                std::to_string(static_cast<long long>(*k.max));
    else if (k.min && k.type == Type::Int)
      allowed = ">= " + std::to_string(static_cast<long long>(*k.min));
    rows.push_back(k.path + "\t" + short_type(k.type) + "\t" +
                   (k.def.is_null() ? "" : show(k.def)) + "\t" + allowed + "\t" +
                   (k.type == Type::Section ? "" : env_name(k.path)) + "\t" + k.doc);
  }
  return rows;
}

std::string default_config_yaml(const std::string& mixed_precision) {
  const KeySpec* mp = find_spec("mixed_precision");
  const std::string value = convert(*mp, mixed_precision, "flag").get<std::string>();
  std::ostringstream out;
  out << "# hasten configuration (Accelerate-compatible keys); docs/config.md lists every key.\n"
      << "compute_environment: LOCAL_MACHINE\n"
      << "distributed_type: 'NO'\n"
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
