// The configuration's sources: a YAML file, the environment and options given in code, each
// read into one layer. Keys hasten's schema does not know wait as pending until the
// strategies' config sections are known (resolve_pending).
#include "config/config_sources.hpp"

#include <hasten/error.hpp>

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/text_util.hpp"

namespace fs = std::filesystem;

namespace hasten::detail {

using json = nlohmann::json;

namespace {

// Adds `value` (a JSON tree with keys relative to `prefix`) to the layer, validating each key
// against `schema`. With `defer`, a key the schema does not know becomes pending (with its
// subtree); without, it is an error with the nearest sibling.
void absorb(Layer& layer, const Schema& schema, bool defer, const std::string& prefix, const json& value,
            const std::string& where, const std::string& origin) {
  if (!value.is_object()) {
    if (prefix.empty()) config_fail(where, "expected a mapping of keys at the top level");
    config_fail(where, prefix + ": expected a mapping, got '" + show(value) + "'");
  }
  for (auto it = value.begin(); it != value.end(); ++it) {
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    const KeySpec* spec = find_spec(schema, path);
    if (spec == nullptr) {
      if (defer) {
        layer.pending.push_back({PendingKey::Source::Tree, path, it.value(), where, origin, ""});
        continue;
      }
      std::string msg = "unknown key '" + path + "'";
      const std::string near = nearest(path, child_keys(schema, prefix));
      if (!near.empty()) msg += " (did you mean '" + near + "'?)";
      config_fail(where, msg);
    }
    if (it.value().is_null()) continue;  // Accelerate writes None as an absent key
    if (spec->type == KeyType::Section) {
      absorb(layer, schema, defer, path, it.value(), where, origin);
      continue;
    }
    layer.values[path] = convert(*spec, it.value(), where);
    layer.origin[path] = origin;
  }
}

// Counts nesting and values while the JSON is parsed, before any tree is built: a tree nested
// 65,000 deep would overflow the stack when it is copied or destroyed.
class BoundedJson : public nlohmann::json_sax<json> {
 public:
  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return enter(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return leave(); }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override { return leave(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    error_ = "not valid JSON";
    return false;
  }
  const std::string& error() const { return error_; }

 private:
  bool value() {
    if (++values_ <= kMaxConfigValues) return true;
    error_ = "holds more than " + std::to_string(kMaxConfigValues) + " values";
    return false;
  }
  bool enter() {
    if (++depth_ > kMaxConfigDepth) {
      error_ = "nests deeper than " + std::to_string(kMaxConfigDepth) + " levels";
      return false;
    }
    return value();
  }
  bool leave() {
    --depth_;
    return true;
  }
  int depth_ = 0;
  size_t values_ = 0;
  std::string error_;
};

json parse_bounded_json(const std::string& text, const std::string& where) {
  BoundedJson bounds;
  if (!json::sax_parse(text, &bounds)) config_fail(where, bounds.error());
  return json::parse(text);
}

bool reserved_env(const std::string& name) {
  static const std::vector<std::string> reserved = {
      "HASTEN_CONFIG_FILE", "HASTEN_CONFIG_JSON", "HASTEN_PLUGIN_PATH", "HASTEN_HOME",
      "HASTEN_LAUNCHED",    "HASTEN_RANK_PREFIXED", "HASTEN_PLUGIN_PROBE_TIMEOUT_S",
      "HASTEN_TRAINING_PROGRAM",  // set by the tracker host for its tracker (tracker_host.cpp)
      "HASTEN_RUN_TOKEN", "HASTEN_BIND_ADDR",  // the run's secret and listen address (rendezvous.cpp)
      "HASTEN_TEST_",       "HASTEN_BENCH_"};
  for (auto& r : reserved)
    if (name == r || (r.back() == '_' && name.rfind(r, 0) == 0)) return true;
  return false;
}

const KeySpec* find_env_spec(const Schema& schema, const std::string& name) {
  for (auto& k : schema)
    if (k.type != KeyType::Section && env_name(k.path) == name) return &k;
  return nullptr;
}

// HASTEN_FSDP_CONFIG__FSDP_VERSION -> fsdp_config.fsdp_version (the inverse of env_name).
std::string path_of_env(const std::string& name) {
  std::string out;
  for (size_t i = std::string("HASTEN_").size(); i < name.size(); ++i) {
    if (name[i] == '_' && i + 1 < name.size() && name[i + 1] == '_') {
      out += '.';
      ++i;
    } else {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(name[i])));
    }
  }
  return out;
}

}  // namespace

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
    config_fail(where, "malformed YAML at line " + std::to_string(e.mark.line + 1) + ", column " +
                           std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  Layer layer;
  layer.label = "file " + path;
  if (root.IsNull()) return layer;  // an empty file sets nothing
  absorb(layer, core_schema(), true, "", yaml_to_json(root, where), where, "file " + path);
  return layer;
}

Layer tree_layer(const json& tree, const std::string& label, const std::string& where, const std::string& origin) {
  Layer layer;
  layer.label = label;
  absorb(layer, core_schema(), true, "", tree, where, origin);
  return layer;
}

Layer env_layer(const Environment& env) {
  Layer layer;
  layer.label = "environment";
  if (auto it = env.find("HASTEN_CONFIG_JSON"); it != env.end() && !it->second.empty()) {
    const json parsed = parse_bounded_json(it->second, "environment HASTEN_CONFIG_JSON");
    // Nested JSON: its own keys, validated like a file.
    absorb(layer, core_schema(), true, "", parsed, "environment HASTEN_CONFIG_JSON", "launcher (HASTEN_CONFIG_JSON)");
  }
  for (auto& [name, value] : env) {
    if (name.rfind("HASTEN_", 0) != 0 || reserved_env(name)) continue;
    const KeySpec* spec = find_env_spec(core_schema(), name);
    const std::string where = "environment " + name;
    if (spec == nullptr) {
      layer.pending.push_back({PendingKey::Source::Env, path_of_env(name), value, where, "env " + name, name});
      continue;
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
  const std::string where = o.origin == "flag" ? std::string("command-line flags") : o.origin + " options";
  auto put = [&](const std::string& key, const json& v) {
    layer.values[key] = convert(*find_spec(core_schema(), key), v, where);
    layer.origin[key] = o.origin;
  };
  if (o.mixed_precision) put("mixed_precision", *o.mixed_precision);
  if (o.gradient_accumulation_steps) put("gradient_accumulation_steps", *o.gradient_accumulation_steps);
  if (o.strategy) put("strategy", *o.strategy);
  if (o.precision) put("precision", *o.precision);
  if (o.trackers) put("trackers", *o.trackers);
  if (o.project_dir) put("project_dir", *o.project_dir);
  if (o.logging_dir) put("logging_dir", *o.logging_dir);
  if (o.automatic_checkpoint_naming) put("automatic_checkpoint_naming", *o.automatic_checkpoint_naming);
  if (o.total_limit) put("total_limit", *o.total_limit);
  if (o.save_on_each_node) put("save_on_each_node", *o.save_on_each_node);
  if (o.resume) put("resume", *o.resume);
  if (o.cpu) put("use_cpu", *o.cpu);
  if (o.step_scheduler_with_optimizer) put("step_scheduler_with_optimizer", *o.step_scheduler_with_optimizer);
  if (o.split_batches) put("split_batches", *o.split_batches);
  if (o.even_batches) put("even_batches", *o.even_batches);
  if (o.dispatch_batches) put("dispatch_batches", *o.dispatch_batches);
  if (o.sync_each_batch) put("sync_each_batch", *o.sync_each_batch);
  if (o.sync_with_dataloader) put("sync_with_dataloader", *o.sync_with_dataloader);
  if (o.short_window_loss_division) put("short_window_loss_division", *o.short_window_loss_division);
  if (o.scheduler_steps_per_process) put("scheduler_steps_per_process", *o.scheduler_steps_per_process);
  if (o.adjust_scheduler) put("adjust_scheduler", *o.adjust_scheduler);
  if (o.pad_out_of_range_dim) put("pad_out_of_range_dim", *o.pad_out_of_range_dim);
  if (o.parallelism_config)
    put("parallelism_config", json{{"parallelism_config_dp_replicate_size", o.parallelism_config->dp_replicate_size},
                                   {"parallelism_config_dp_shard_size", o.parallelism_config->dp_shard_size},
                                   {"parallelism_config_tp_size", o.parallelism_config->tp_size},
                                   {"parallelism_config_cp_size", o.parallelism_config->cp_size}});
  for (auto& [key, text] : o.set) {
    const json value = yaml_text_to_json(text, where + " (" + key + ")");
    const KeySpec* spec = find_spec(core_schema(), key);
    if (spec == nullptr || spec->type == KeyType::Section) {
      layer.pending.push_back({PendingKey::Source::Set, key, value, where, o.origin, ""});
      continue;
    }
    if (value.is_null()) continue;
    layer.values[key] = convert(*spec, value, where);
    layer.origin[key] = o.origin;
  }
  return layer;
}

void resolve_pending(Layer& layer, const Schema& full) {
  std::vector<PendingKey> pending;
  pending.swap(layer.pending);
  for (auto& p : pending) {
    switch (p.source) {
      case PendingKey::Source::Tree: {
        const auto dot = p.path.rfind('.');
        const std::string prefix = dot == std::string::npos ? "" : p.path.substr(0, dot);
        json tree = json::object();
        tree[p.path.substr(dot == std::string::npos ? 0 : dot + 1)] = p.value;
        absorb(layer, full, false, prefix, tree, p.where, p.origin);
        break;
      }
      case PendingKey::Source::Env: {
        const KeySpec* spec = find_env_spec(full, p.env);
        if (spec == nullptr) {
          std::vector<std::string> known;
          for (auto& k : full)
            if (k.type != KeyType::Section) known.push_back(env_name(k.path));
          std::string msg = "'" + p.env + "' is not a hasten setting";
          const std::string near = nearest(p.env, known);
          if (!near.empty()) msg += " (did you mean '" + near + "'?)";
          throw ConfigError("config error: environment: " + msg);
        }
        if (p.value.get<std::string>().empty()) break;
        layer.values[spec->path] = convert(*spec, p.value, p.where);
        layer.origin[spec->path] = p.origin;
        break;
      }
      case PendingKey::Source::Set: {
        const KeySpec* spec = find_spec(full, p.path);
        // One field of a mapping-valued key whose fields hasten checks itself (`profile.active=3`,
        // `parallelism_config.parallelism_config_tp_size=2`):
        // merged into that key's mapping, as mappings from different sources are. Other
        // mappings (plugin options, Accelerate's compatibility sections) are set whole.
        const auto dot = p.path.find('.');
        const KeySpec* map = spec == nullptr && dot != std::string::npos ? find_spec(full, p.path.substr(0, dot)) : nullptr;
        const bool checked_fields = map != nullptr && (map->path == "profile" || map->path == "parallelism_config");
        if (checked_fields && p.path.find('.', dot + 1) == std::string::npos) {
          const json field = convert(*map, json{{p.path.substr(dot + 1), p.value}}, p.where);  // UTF-8, shape
          json& fields = layer.values[map->path];
          if (!fields.is_object()) fields = json::object();
          fields.merge_patch(field);
          layer.origin[map->path] = p.origin;
          break;
        }
        if (spec == nullptr || spec->type == KeyType::Section) {
          std::vector<std::string> all;
          for (auto& k : full) all.push_back(k.path);
          std::string msg = "unknown key '" + p.path + "'";
          const std::string near = nearest(p.path, all);
          if (!near.empty()) msg += " (did you mean '" + near + "'?)";
          config_fail(p.where, msg);
        }
        if (p.value.is_null()) break;
        layer.values[p.path] = convert(*spec, p.value, p.where);
        layer.origin[p.path] = p.origin;
        break;
      }
    }
  }
}

}  // namespace hasten::detail
