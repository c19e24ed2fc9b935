// `hasten config [--config_file F]`: Accelerate's questionnaire. It asks where the run executes,
// how many machines and processes, the strategy (the distributed_type values the installed
// strategy plugins answer to) and its main options (the section keys the plugin describes
// with a default), mixed precision and trackers (the installed ones), then writes a YAML file
// with Accelerate's key names. Enter takes the default; a bad answer is re-asked with what is
// allowed; end of input aborts with nothing written.
#include <hasten/config.hpp>
#include <hasten/error.hpp>
#include <hasten/process.hpp>
#include <hasten/registry.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "commands.hpp"

namespace hasten::cli {

namespace {

// End of input: the user left; nothing is written.
struct Aborted {};

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// One question: prints the prompt, reads a line, returns the default on an empty line and
// otherwise what `parse` makes of the answer; `parse` returns nullopt and sets `why` to re-ask.
template <typename T, typename Parse>
T ask(const std::string& question, const std::string& shown_default, Parse parse) {
  for (;;) {
    std::cout << question << (shown_default.empty() ? "" : " [" + shown_default + "]") << ": " << std::flush;
    std::string line;
    if (!std::getline(std::cin, line)) throw Aborted{};
    std::string answer = trim(line);
    if (answer.empty()) answer = shown_default;
    std::string why;
    if (auto v = parse(answer, why)) return *v;
    std::cout << "  " << why << std::endl;
  }
}

long long ask_int(const std::string& question, long long def, long long min, long long max) {
  return ask<long long>(question, std::to_string(def), [&](const std::string& a, std::string& why) -> std::optional<long long> {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(a.c_str(), &end, 10);
    if (a.empty() || *end != '\0' || errno != 0 || v < min || v > max) {
      why = "'" + a + "' is not allowed (allowed: an integer from " + std::to_string(min) + " to " + std::to_string(max) + ")";
      return std::nullopt;
    }
    return v;
  });
}

// A choice among names, answered by its name (any case) or its number in the list.
std::string ask_choice(const std::string& question, const std::vector<std::string>& choices,
                       const std::vector<std::string>& notes, const std::string& def) {
  std::cout << question << "\n";
  for (size_t i = 0; i < choices.size(); ++i)
    std::cout << "  [" << i << "] " << choices[i] << (i < notes.size() && !notes[i].empty() ? "  (" + notes[i] + ")" : "")
              << "\n";
  return ask<std::string>("Your choice", def, [&](const std::string& a, std::string& why) -> std::optional<std::string> {
    for (size_t i = 0; i < choices.size(); ++i)
      if (lower(choices[i]) == lower(a) || a == std::to_string(i)) return choices[i];
    why = "'" + a + "' is not allowed (allowed: " + join(choices, ", ") + ", or its number 0-" +
          std::to_string(choices.size() - 1) + ")";
    return std::nullopt;
  });
}

std::string ask_text(const std::string& question, const std::string& def) {
  return ask<std::string>(question, def, [](const std::string& a, std::string& why) -> std::optional<std::string> {
    if (a.empty() || a.find_first_of(" \t'\"") != std::string::npos) {
      why = "'" + a + "' is not allowed (allowed: a host name or address, without spaces or quotes)";
      return std::nullopt;
    }
    return a;
  });
}

// A YAML scalar for a described option's answer, as its type wants it.
std::optional<nlohmann::json> option_value(const PluginOption& o, const std::string& a, std::string& why) {
  auto num = [&](double d) {
    return o.type == "int" ? std::to_string(static_cast<long long>(d)) : nlohmann::json(d).dump();
  };
  auto range = [&]() {
    std::string r;
    if (o.min && o.max) r = " from " + num(*o.min) + " to " + num(*o.max);
    else if (o.min) r = " >= " + num(*o.min);
    return r;
  };
  if (o.type == "bool") {
    const std::string l = lower(a);
    if (l == "true" || l == "yes" || l == "y") return true;
    if (l == "false" || l == "no" || l == "n") return false;
    why = "'" + a + "' is not allowed (allowed: yes or no)";
    return std::nullopt;
  }
  if (o.type == "int" || o.type == "float") {
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(a.c_str(), &end);
    const bool integral = o.type == "int" && a.find_first_of(".eE") == std::string::npos;
    if (a.empty() || *end != '\0' || errno != 0 || (o.type == "int" && !integral) || (o.min && d < *o.min) ||
        (o.max && d > *o.max)) {
      why = "'" + a + "' is not allowed (allowed: " + (o.type == "int" ? "an integer" : "a number") + range() + ")";
      return std::nullopt;
    }
    if (o.type == "int") return static_cast<long long>(d);
    return d;
  }
  if (o.type == "enum") {
    for (auto& v : o.allowed)
      if (lower(v) == lower(a)) return v;
    why = "'" + a + "' is not allowed (allowed: " + join(o.allowed, ", ") + ")";
    return std::nullopt;
  }
  if (a.empty()) {
    why = "an answer is needed";
    return std::nullopt;
  }
  return a;
}

std::string default_text(const PluginOption& o) {
  const auto v = nlohmann::json::parse(o.default_json);
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  return v.is_string() ? v.get<std::string>() : v.dump();
}

std::string yaml_scalar(const nlohmann::ordered_json& v) {
  if (v.is_string()) return "'" + v.get<std::string>() + "'";  // names only: no quotes inside
  return v.dump();
}

int wizard(const std::string& file_flag) {
  const std::string path = file_flag.empty() ? default_config_path(current_environment()) : file_flag;
  if (path.empty())
    return report_error("there is no home directory for the default config file (HOME is unset and the user has none); "
                        "pass --config_file or set HASTEN_HOME");
  std::error_code ec;
  try {
    if (std::filesystem::exists(path, ec)) {
      const std::string again = ask_choice("The config file " + path + " exists. Overwrite it?", {"no", "yes"}, {}, "no");
      if (again != "yes") {
        std::cout << "hasten config: kept " << path << "; nothing written" << std::endl;
        return 1;
      }
    }
    auto& registry = PluginRegistry::instance();
    const std::vector<PluginInfo> plugins = registry.plugins();

    // The keys' defaults, bounds and values come from the schema (config_keys()), as they do
    // for `hasten config keys`, docs/config.md and hasten launch's flags.
    std::map<std::string, ConfigKeyInfo> keys;
    for (auto& k : config_keys()) keys[k.key] = k;
    auto key = [&](const std::string& name) -> const ConfigKeyInfo& {
      auto it = keys.find(name);
      if (it == keys.end()) throw ConfigError("the config schema has no key '" + name + "'");
      return it->second;
    };
    auto int_default = [&](const ConfigKeyInfo& k) { return std::stoll(k.default_text); };
    auto int_max = [&](const ConfigKeyInfo& k) { return k.max ? static_cast<long long>(*k.max) : 1ll << 20; };

    const std::string where = ask_choice("In which compute environment are you running?",
                                         {"this machine", "multiple machines"}, {}, "this machine");
    const ConfigKeyInfo& port_key = key("main_process_port");
    long long machines = 1, machine_rank = 0, port = int_default(port_key);
    std::string ip;
    if (where == "multiple machines") {
      machines = ask_int("How many machines will the run use? (" + key("num_machines").doc + ")", 2, 2,
                         int_max(key("num_machines")));
      machine_rank = ask_int("What is the rank of this machine? (" + key("machine_rank").doc + ")", 0, 0, machines - 1);
      ip = ask_text("What is the IP address of the machine of rank 0?", "");
      // Several machines cannot pick a free port each: the port is one they all know.
      port = ask_int("What port will rank 0 listen on for the rendezvous?", port, 1, int_max(port_key));
    }

    // distributed_type: the values the installed strategies answer to.
    std::vector<std::string> types, notes;
    std::map<std::string, const PluginInfo*> by_type;
    for (auto& p : plugins)
      if (p.kind == PluginKind::Strategy)
        for (auto& t : p.distributed_types) by_type.emplace(t, &p);
    for (auto& [t, p] : by_type) {
      if (t == "NO" && machines > 1) continue;  // one process cannot span machines
      types.push_back(t);
      notes.push_back("strategy " + p->name + ": " + p->description);
    }
    if (types.empty()) throw ConfigError("no strategy plugin answers to a distributed_type; see hasten plugins list");
    std::string def_type = machines > 1 || !by_type.count("NO") ? (by_type.count("MULTI_CPU") ? "MULTI_CPU" : types.front()) : "NO";
    const std::string type = ask_choice("Which kind of distributed training?", types, notes, def_type);
    const PluginInfo& strategy = *by_type.at(type);

    // The strategy's main options: the section keys its description gives a default.
    std::vector<std::pair<std::string, nlohmann::json>> section;
    if (!strategy.config_section.empty())
      for (auto& o : strategy.options) {
        if (o.section_key.empty() || o.name.empty() || o.default_json.empty()) continue;
        const std::string shown = o.type == "enum" ? " (" + join(o.allowed, ", ") + ")"
                                  : o.type == "bool" ? " (yes/no)"
                                                     : "";
        const nlohmann::json v = ask<nlohmann::json>(
            strategy.config_section + "." + o.section_key + ": " + o.help + shown, default_text(o),
            [&](const std::string& a, std::string& why) { return option_value(o, a, why); });
        section.emplace_back(o.section_key, v);
      }

    long long processes = 1;
    if (type != "NO") {
      processes = ask<long long>(
          "How many processes in total, across all machines?", std::to_string(2 * machines),
          [&](const std::string& a, std::string& why) -> std::optional<long long> {
            char* end = nullptr;
            errno = 0;
            const long long v = std::strtoll(a.c_str(), &end, 10);
            if (a.empty() || *end != '\0' || errno != 0 || v < 1 || v > (1 << 20) || v % machines != 0) {
              why = "'" + a + "' is not allowed (allowed: a positive multiple of the " + std::to_string(machines) +
                    " machine" + (machines == 1 ? "" : "s") + ")";
              return std::nullopt;
            }
            return v;
          });
    }
    // mixed_precision's values, each with the description of the precision plugin it selects.
    const ConfigKeyInfo& mp = key("mixed_precision");
    std::vector<std::string> mp_notes;
    for (auto& choice : mp.choices) {
      std::string note;
      for (auto& p : plugins)
        if (p.kind == PluginKind::Precision && p.name == choice) note = p.description;
      mp_notes.push_back(note);
    }
    const std::string precision = ask_choice("Mixed precision?", mp.choices, mp_notes, mp.default_text);

    std::vector<std::string> installed;
    for (auto& p : plugins)
      if (p.kind == PluginKind::Tracker) installed.push_back(p.name);
    std::sort(installed.begin(), installed.end());
    const std::vector<std::string> trackers = ask<std::vector<std::string>>(
        "Trackers to log with (comma-separated; installed: " + join(installed, ", ") + "; all; none)", "none",
        [&](const std::string& a, std::string& why) -> std::optional<std::vector<std::string>> {
          if (lower(a) == "none") return std::vector<std::string>{};
          if (lower(a) == "all") return std::vector<std::string>{"all"};
          std::vector<std::string> out;
          std::stringstream ss(a);
          for (std::string item; std::getline(ss, item, ',');) {
            item = trim(item);
            if (item.empty()) continue;
            if (std::find(installed.begin(), installed.end(), item) == installed.end()) {
              why = "'" + item + "' is not allowed (allowed: " + join(installed, ", ") + ", all or none)";
              return std::nullopt;
            }
            out.push_back(item);
          }
          return out;
        });

    // Accelerate's keys (its launcher reads the file too), then hasten's trackers.
    nlohmann::ordered_json doc;
    doc["compute_environment"] = "LOCAL_MACHINE";
    doc["distributed_type"] = type;
    doc["mixed_precision"] = precision;
    doc["num_machines"] = machines;
    doc["num_processes"] = processes;
    doc["machine_rank"] = machine_rank;
    if (machines > 1) doc["main_process_ip"] = ip;
    doc["main_process_port"] = port;
    doc["rdzv_backend"] = "static";
    doc["same_network"] = true;
    doc["use_cpu"] = true;
    doc["debug"] = false;
    if (!section.empty())
      for (auto& [k, v] : section) doc[strategy.config_section][k] = v;
    if (!trackers.empty()) doc["trackers"] = trackers;
    // As Accelerate: JSON for a path ending in .json, else YAML.
    const bool as_json = std::filesystem::path(path).extension() == ".json";
    std::string text;
    if (as_json) {
      text = doc.dump(2) + "\n";
    } else {
      text = "# Written by hasten config; docs/config.md lists every key.\n";
      for (auto it = doc.begin(); it != doc.end(); ++it) {
        if (it.value().is_object()) {
          text += it.key() + ":\n";
          for (auto kv = it.value().begin(); kv != it.value().end(); ++kv)
            text += "  " + kv.key() + ": " + yaml_scalar(kv.value()) + "\n";
        } else if (it.value().is_array()) {
          text += it.key() + ": [" + join(it.value().get<std::vector<std::string>>(), ", ") + "]\n";
        } else {
          text += it.key() + ": " + yaml_scalar(it.value()) + "\n";
        }
      }
    }

    const auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) return report_error("cannot create directory '" + parent.string() + "': " + ec.message());
    {
      std::ofstream out(path);
      out << text;
      out.close();
      if (!out) return report_error("cannot write config file '" + path + "'");
    }
    try {
      (void)load_config_file(path);  // what a run will read back
    } catch (const std::exception&) {
      std::filesystem::remove(path, ec);
      throw;
    }
    std::cout << "hasten: wrote " << path << std::endl;
    return 0;
  } catch (const Aborted&) {
    std::cout << std::endl;
    std::cerr << "hasten config: end of input; nothing written" << std::endl;
    return 1;
  }
}

}  // namespace

void add_config_wizard(CLI::App& config_cmd, Action& action) {
  auto file = std::make_shared<std::string>();
  config_cmd.add_option("--config_file,--config-file", *file,
                        "The questionnaire writes this file (default: the user's default file)");
  // `hasten config` alone is the questionnaire, as `accelerate config` is.
  config_cmd.callback([&action, &config_cmd, file] {
    if (!config_cmd.get_subcommands().empty()) return;
    action = [file] { return wizard(*file); };
  });
}

}  // namespace hasten::cli
