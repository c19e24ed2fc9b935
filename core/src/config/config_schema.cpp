// The configuration's key schema and the conversion of one value against its key.
#include "config/config_schema.hpp"

#include <hasten/error.hpp>

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "util/text_util.hpp"

namespace hasten::detail {

using json = nlohmann::json;

const Schema& core_schema() {
  using T = KeyType;
  static const Schema keys = {
      // ---- Accelerate's keys --------------------------------------------------------------
      {"compute_environment", T::Enum, "LOCAL_MACHINE", {"LOCAL_MACHINE"}, {}, {},
       "Where the run executes; only LOCAL_MACHINE (Accelerate's AMAZON_SAGEMAKER is not supported)"},
      {"distributed_type", T::Enum, "NO", {}, {}, {},
       "Selects the strategy when `strategy` is not set: the one that answers to it (NO -> single, "
       "MULTI_CPU/MULTI_GPU -> ddp, FSDP -> fsdp, DEEPSPEED -> zero; `hasten plugins describe`)"},
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
      {"dynamo_config", T::Map, json(), {}, {}, {}, "Accelerate's; dynamo_backend NO only: a backend is refused (torch.compile has no C++ counterpart)"},
      {"fp8_config", T::Map, json(), {}, {}, {}, "Accepted for Accelerate compatibility (fp8 is not supported)", true},
      {"mpirun_config", T::Map, json(), {}, {}, {}, "Accepted for Accelerate compatibility (hasten launch starts CPU workers itself)", true},
      {"parallelism_config", T::Map, json(), {}, {}, {},
       "Accelerate's ParallelismConfig: the device mesh's sizes {parallelism_config_dp_replicate_size, "
       "parallelism_config_dp_shard_size, parallelism_config_tp_size, parallelism_config_cp_size} (cp: 1 only); "
       "their product is the number of processes (all 1: dp_replicate over every process); "
       "Accelerator::device_mesh() gives each dimension's process group"},
      {"megatron_lm_config", T::Map, json(), {}, {}, {}, "Accepted for Accelerate compatibility", true},

      // ---- hasten's keys --------------------------------------------------------------------
      {"strategy", T::String, json(), {}, {}, {},
       "Strategy plugin: a name (single, ddp, fsdp, zero), a preset, or a path to a plugin library"},
      {"strategy_options", T::Map, json::object(), {}, {}, {}, "Options handed to the strategy plugin"},
      {"precision", T::String, json(), {}, {}, {},
       "Precision plugin: a name (no, bf16, fp16) or a path; defaults to mixed_precision"},
      {"precision_options", T::Map, json::object(), {}, {}, {},
       "Options of the precision plugin (fp16: init_scale, growth_factor, backoff_factor, growth_interval)"},
      {"trackers", T::StringList, json::array(), {}, {}, {},
       "Tracker plugins that init_trackers starts (names or paths), e.g. [csv, jsonl]; all: every installed tracker"},
      {"log_with", T::StringList, json::array(), {}, {}, {},
       "Accelerate's name for trackers (a list, or all); setting both to different lists is an error"},
      {"tracker_options", T::Map, json::object(), {}, {}, {},
       "Per-tracker options keyed by the tracker as trackers names it or by its plugin name (another key is an error)"},
      {"trackers_in_process", T::Bool, false, {}, {}, {},
       "Run tracker plugins inside the training process (default: each in a host process of its own, so that a "
       "crashing tracker is reported and dropped instead of ending the run)"},
      {"comm", T::Any, "auto", {}, {}, {},
       "Comm backend per device type: a name or path for CPU tensors, or a mapping {cpu: X, cuda: Y}; "
       "auto picks the serving plugin of highest priority that fits the run"},
      {"comm_options", T::Map, json::object(), {}, {}, {}, "Options of the CPU comm backend (a mapping), or per device type as comm is: {cpu: {...}, cuda: {...}} (cuda's apply when the model is on a GPU)"},
      {"plugin_path", T::StringList, json::array(), {}, {}, {}, "Extra plugin directories, searched last"},
      {"project_dir", T::String, ".", {}, {}, {}, "Base directory of the run's outputs"},
      {"logging_dir", T::String, "", {}, {}, {}, "Tracker output directory (default <project_dir>/hasten_logs)"},
      {"automatic_checkpoint_naming", T::Bool, false, {}, {}, {},
       "save_state() without a directory writes <project_dir>/checkpoints/checkpoint_<N> (always, when true)"},
      {"total_limit", T::Int, 0, {}, 0.0, {},
       "Complete automatic checkpoints kept; older ones are removed after each save (0: keep all)"},
      {"save_on_each_node", T::Bool, false, {}, {}, {},
       "Each machine's first process writes a whole checkpoint on that machine (no shared file system); "
       "each machine resumes from its own copy"},
      {"profile", T::Map, json::object(), {}, {}, {},
       "LibTorch's profiler over optimizer steps: {wait: 0, warmup: 1, active: 3, dir: <project_dir>/profile}; "
       "one Chrome trace per rank (Perfetto, TensorBoard) with hasten's phases as named ranges"},
      {"resume", T::String, "no", {}, {}, {},
       "Continue from a checkpoint when the loop starts: no, auto (the newest complete one under "
       "<project_dir>/checkpoints, if any) or a checkpoint directory"},
      // The upper bound keeps a deadline in nanoseconds within 64 bits (1e300 s became negative).
      {"timeout_s", T::Float, 1800.0, {}, 0.001, 31536000.0, "Deadline of every collective wait (at most a year)"},
      {"rendezvous_timeout_s", T::Float, 300.0, {}, 0.001, 31536000.0,
       "Deadline of the rendezvous, of every store call and of the comm backend's connection set-up (at most timeout_s)"},
      {"log_level", T::Enum, "info", {"trace", "debug", "info", "warn", "error", "off"}, {}, {}, "hasten's log level"},
      {"step_scheduler_with_optimizer", T::Bool, true, {}, {}, {},
       "Prepared schedulers step once per real optimizer step (false: on every call)"},
      {"split_batches", T::Bool, false, {}, {}, {},
       "The loader's batch size is the global batch, split across processes"},
      {"even_batches", T::Bool, true, {}, {}, {},
       "Pad the last round so every process gets the same number of full batches"},
      {"dispatch_batches", T::Bool, json(), {}, {}, {},
       "Rank 0 alone reads each prepared loader and broadcasts every round, each process keeping its slice "
       "(Accelerate's DataLoaderDispatcher); unset: on for stream datasets, off for map-style ones"},
      {"activation_checkpointing", T::Bool, false, {}, {}, {},
       "Every prepared model's outermost hasten::Unit blocks keep no activations and run again in backward (under "
       "every strategy; fsdp_config.fsdp_activation_checkpointing sets it too)"},
      {"sharded_init", T::Bool, false, {}, {}, {},
       "Models built after the Accelerator and before its first prepare keep only this rank's shard of each "
       "hasten::Unit once it is constructed, under strategies that shard parameters at rest (zero3, fsdp "
       "FULL_SHARD); deepspeed_config.zero3_init_flag and fsdp_config.fsdp_cpu_ram_efficient_loading set it too"},
      {"sync_each_batch", T::Bool, false, {}, {}, {},
       "Under accumulate(), reduce gradients on every micro-batch (more communication, less memory); the optimizer "
       "still steps every gradient_accumulation_steps-th (Accelerate's GradientAccumulationPlugin sync_each_batch)"},
      {"sync_with_dataloader", T::Bool, true, {}, {}, {},
       "The loader's last batch synchronises and restarts the accumulation count (false: windows run across epochs)"},
      {"short_window_loss_division", T::Enum, "window", {"window", "steps"}, {}, {},
       "Loss division in a short last accumulation window: window (by the micro-batches it has) or steps (by "
       "gradient_accumulation_steps, Accelerate's arithmetic)"},
      {"scheduler_steps_per_process", T::Bool, false, {}, {}, {},
       "A prepared scheduler steps num_processes times per optimizer step unless split_batches (Accelerate's "
       "AcceleratedScheduler); false: once"},
      {"adjust_scheduler", T::Bool, true, {}, {}, {},
       "With scheduler_steps_per_process: a prepared scheduler's step() on an accumulation micro-batch counts "
       "toward a bounded schedule's total_steps, as Accelerate's GradientAccumulationPlugin adjust_scheduler "
       "(needs scheduler_steps_per_process: true)"},
      {"pad_out_of_range_dim", T::Enum, "error", {"error", "unchanged"}, {}, {},
       "pad_across_processes with a dim outside the tensor: error, or unchanged (returns the tensor, Accelerate's)"},
      {"num_cpu_threads_per_process", T::Int, 0, {}, 0.0, {}, "Intra-op threads per worker (0: cores / local workers)"},
      {"max_restarts", T::Int, 0, {}, 0.0, {},
       "hasten launch restarts every worker this many times after one fails (one machine; torchrun's meaning)"},
      {"tee", T::Bool, false, {}, {}, {}, "hasten launch also writes each rank's output to log_dir"},
      {"log_dir", T::String, "", {}, {}, {}, "Where hasten launch writes per-rank logs"},
  };
  return keys;
}

const KeySpec* find_spec(const Schema& schema, const std::string& path) {
  for (auto& k : schema)
    if (k.path == path) return &k;
  return nullptr;
}

std::vector<std::string> child_keys(const Schema& schema, const std::string& parent) {
  std::vector<std::string> out;
  for (auto& k : schema) {
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

namespace {

std::string type_name(KeyType t) {
  switch (t) {
    case KeyType::Bool: return "a boolean (true or false)";
    case KeyType::Int: return "an integer";
    case KeyType::Float: return "a number";
    case KeyType::String: return "a string";
    case KeyType::Enum: return "one of a set of names";
    case KeyType::StringList: return "a list of strings";
    case KeyType::Map: return "a mapping";
    case KeyType::Section: return "a mapping";
    case KeyType::Any: return "any value";
  }
  return "a value";
}

}  // namespace

std::string short_type(KeyType t) {
  switch (t) {
    case KeyType::Bool: return "bool";
    case KeyType::Int: return "int";
    case KeyType::Float: return "float";
    case KeyType::String: return "string";
    case KeyType::Enum: return "enum";
    case KeyType::StringList: return "list";
    case KeyType::Map: return "map";
    case KeyType::Section: return "section";
    case KeyType::Any: return "any";
  }
  return "?";
}

std::string show(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  // A message shows text that is not UTF-8 with replacement characters rather than failing.
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// Scalars of YAML become typed JSON; quoted scalars stay strings.
json yaml_scalar(const YAML::Node& node) {
  const std::string s = node.Scalar();
  if (node.Tag() == "!") return s;  // quoted: a string, whatever it looks like
  const std::string l = to_lower(s);
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

// The conversion's walk, counting what it has produced so far. Aliases are followed (they
// share nodes), which is why a cycle or an expansion shows up as depth or count here.
struct YamlWalk {
  const std::string& where;
  size_t values = 0;

  json convert(const YAML::Node& node, int depth, const std::string& path) {
    if (depth > kMaxConfigDepth)
      config_fail(where, "nests deeper than " + std::to_string(kMaxConfigDepth) + " levels" +
                             (path.empty() ? "" : " at '" + path + "'") + " (a recursive YAML alias?)");
    if (++values > kMaxConfigValues)
      config_fail(where, "holds more than " + std::to_string(kMaxConfigValues) +
                             " values once aliases are expanded (nested YAML aliases?)");
    switch (node.Type()) {
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined: return nullptr;
      case YAML::NodeType::Sequence: {
        json arr = json::array();
        size_t i = 0;
        for (const auto& item : node) arr.push_back(convert(item, depth + 1, path + "[" + std::to_string(i++) + "]"));
        return arr;
      }
      case YAML::NodeType::Map: {
        json obj = json::object();
        for (const auto& kv : node) {
          if (!kv.first.IsScalar())
            config_fail(where, "a mapping key" + (path.empty() ? "" : " under '" + path + "'") +
                                   " is a list, a mapping or empty; keys are names");
          const std::string key = kv.first.Scalar();
          const std::string full = path.empty() ? key : path + "." + key;
          // yaml-cpp keeps both entries of a repeated key; which one a reader takes differs
          // between readers, so a repeat is refused rather than silently resolved.
          if (obj.contains(key)) config_fail(where, "the key '" + full + "' appears twice in one mapping");
          obj[key] = convert(kv.second, depth + 1, full);
        }
        return obj;
      }
      case YAML::NodeType::Scalar: break;
    }
    return yaml_scalar(node);
  }
};

}  // namespace

json yaml_to_json(const YAML::Node& node, const std::string& where) {
  YamlWalk walk{where};
  return walk.convert(node, 1, "");
}

json yaml_text_to_json(const std::string& text, const std::string& where) {
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    // The value as written, cut so that a huge variable still makes a one-line message.
    const std::string shown = text.size() > 80 ? text.substr(0, 80) + "..." : text;
    config_fail(where, "malformed YAML value '" + shown + "': " + e.msg);
  }
  return yaml_to_json(node, where);
}

[[noreturn]] void config_fail(const std::string& where, const std::string& what) {
  throw ConfigError("config error: " + where + ": " + what);
}

namespace {

std::optional<bool> parse_bool(const std::string& s) {
  const std::string l = to_lower(trim(s));
  if (l == "true" || l == "yes" || l == "on" || l == "1") return true;
  if (l == "false" || l == "no" || l == "off" || l == "0") return false;
  return std::nullopt;
}

}  // namespace

namespace {

// Converts and checks a value against its key's spec. `v` may be typed or a string (from
// the environment or YAML).
json convert_value(const KeySpec& spec, const json& v, const std::string& where) {
  const std::string& key = spec.path;
  auto wrong = [&]() -> json {
    config_fail(where, key + ": expected " + type_name(spec.type) + ", got '" + show(v) + "'");
  };
  auto range = [&](double x) {
    if ((spec.min && x < *spec.min) || (spec.max && x > *spec.max)) {
      std::string allowed;
      auto num = [](double d) {
        std::ostringstream o;
        o.precision(15);  // 31536000, not 3.1536e+07
        o << d;
        return o.str();
      };
      if (spec.min && spec.max)
        allowed = num(*spec.min) + " to " + num(*spec.max);
      else if (spec.min)
        allowed = ">= " + num(*spec.min);
      else
        allowed = "<= " + num(*spec.max);
      config_fail(where, key + ": " + show(v) + " is out of range (allowed: " + allowed + ")");
    }
  };
  switch (spec.type) {
    case KeyType::Bool: {
      if (v.is_boolean()) return v;
      if (v.is_string()) {
        if (auto b = parse_bool(v.get<std::string>())) return *b;
      }
      if (v.is_number_integer() && (v.get<long long>() == 0 || v.get<long long>() == 1))
        return v.get<long long>() == 1;
      return wrong();
    }
    case KeyType::Int: {
      long long i = 0;
      if (v.is_number_integer()) {
        i = v.get<long long>();
      } else if (v.is_string()) {
        const std::string s = trim(v.get<std::string>());
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
    case KeyType::Float: {
      double d = 0;
      if (v.is_number()) {
        d = v.get<double>();
      } else if (v.is_string()) {
        const std::string s = trim(v.get<std::string>());
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
    case KeyType::String: {
      if (v.is_string()) return v;
      if (v.is_number() || v.is_boolean()) return v.dump();
      return wrong();
    }
    case KeyType::Enum: {
      // distributed_type before the strategies are known: checked again once they are.
      if (spec.choices.empty() && v.is_string()) return trim(v.get<std::string>());
      if (!v.is_string()) {
        config_fail(where, key + ": '" + show(v) + "' is not allowed (allowed: " +
                        join(spec.choices, ", ") + ")");
      }
      const std::string s = trim(v.get<std::string>());
      for (auto& c : spec.choices)
        if (to_lower(c) == to_lower(s)) return c;
      std::string msg = key + ": '" + s + "' is not allowed (allowed: " +
                        join(spec.choices, ", ") + ")";
      const std::string near = nearest(s, spec.choices);
      if (!near.empty()) msg += "; did you mean '" + near + "'?";
      config_fail(where, msg);
    }
    case KeyType::StringList: {
      json out = json::array();
      // A list written in YAML's flow style ("[csv, jsonl]") from the environment or a flag;
      // a '[' that does not close is an error, not a plugin named "[csv".
      if (v.is_string() && !trim(v.get<std::string>()).empty() && trim(v.get<std::string>()).front() == '[')
        return convert_value(spec, yaml_text_to_json(v.get<std::string>(), where), where);
      if (v.is_string()) {
        std::stringstream ss(v.get<std::string>());
        std::string item;
        while (std::getline(ss, item, ',')) {
          item = trim(item);
          if (!item.empty()) out.push_back(item);
        }
        return out;
      }
      if (!v.is_array()) return wrong();
      for (auto& item : v) {
        if (!item.is_string())
          config_fail(where, key + ": expected a list of strings, got item '" + show(item) + "'");
        out.push_back(item);
      }
      return out;
    }
    case KeyType::Map: {
      if (v.is_object()) return v;
      if (v.is_string()) {  // from the environment: JSON or YAML text
        const json parsed = yaml_text_to_json(v.get<std::string>(), where);
        if (parsed.is_object()) return parsed;
      }
      return wrong();
    }
    case KeyType::Section:
    case KeyType::Any: return v;
  }
  return v;
}

}  // namespace

json convert(const KeySpec& spec, const json& v, const std::string& where) {
  json out = convert_value(spec, v, where);
  // The config travels as JSON (to workers, to plugins' options), which holds only UTF-8: a
  // value that cannot be written is refused here, where its key and source are known.
  try {
    (void)out.dump();
  } catch (const json::type_error&) {
    config_fail(where, spec.path + ": the value holds text that is not valid UTF-8");
  }
  return out;
}

}  // namespace hasten::detail
