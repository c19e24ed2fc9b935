// Reading and checking what ABI 1.2 descriptors describe.
#include "plugins/plugin_description.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <set>
#include <sstream>
#include <vector>

#include "plugins/abi_array.hpp"
#include "util/text_util.hpp"

namespace hasten::detail {

namespace {

std::string text_or_empty(const char* s) { return s != nullptr ? s : ""; }

bool lower_word(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

bool upper_word(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!detail::trim(item).empty()) out.push_back(detail::trim(item));
  return out;
}

// Reads what ABI 1.2 descriptors add (options, config section, distributed types) into info;
// returns why the description is refused, or "".
}  // namespace

std::string read_description(const hasten_plugin_descriptor& d, PluginKind kind, PluginInfo& info) {
  static const char* const type_names[] = {"", "bool", "int", "float", "string", "enum", "list", "any"};
  const bool strategy = kind == PluginKind::Strategy;
  if (d.config_section != nullptr) {
    if (!strategy) return "config_section is for strategies only";
    if (!lower_word(d.config_section))
      return "config_section '" + std::string(d.config_section) + "' is not 1-64 characters of a-z, 0-9 and '_'";
    info.config_section = d.config_section;
  }
  if (d.distributed_types != nullptr) {
    if (!strategy) return "distributed_types is for strategies only";
    for (auto& t : split_commas(d.distributed_types)) {
      if (!upper_word(t)) return "distributed_types entry '" + t + "' is not 1-64 characters of A-Z, 0-9 and '_'";
      info.distributed_types.push_back(t);
    }
  }
  if (d.n_options > 0 && d.options == nullptr)
    return "declares " + std::to_string(d.n_options) + " options but options is NULL";
  if (d.n_options > 4096) return "declares " + std::to_string(d.n_options) + " options";
  info.options_described = d.options != nullptr;
  std::set<std::string> names, section_keys;
  for (uint32_t i = 0; i < d.n_options; ++i) {
    hasten_option_spec o{};
    if (std::string why; !abi_element(d.options, i, &o, &why)) return "options: " + why;
    const std::string at = "option " + std::to_string(i);
    if (o.struct_size < offsetof(hasten_option_spec, run_setting) + sizeof(void*))
      return at + " has a too small struct_size " + std::to_string(o.struct_size);
    PluginOption opt;
    opt.name = text_or_empty(o.name);
    opt.section_key = text_or_empty(o.section_key);
    opt.run_setting = text_or_empty(o.run_setting);
    opt.help = text_or_empty(o.help);
    const std::string what = opt.name.empty() ? at : "option '" + opt.name + "'";
    if (o.name != nullptr && !lower_word(opt.name))
      return at + " has an invalid name '" + untrusted_text(o.name) + "' (allowed: 1-64 characters of a-z, 0-9 and '_')";
    if (o.name == nullptr && o.section_key == nullptr) return at + " has neither a name nor a section_key";
    if (!opt.name.empty() && !names.insert(opt.name).second) return "option '" + opt.name + "' is declared twice";
    if (o.type < HASTEN_OPTION_BOOL || o.type > HASTEN_OPTION_ANY)
      return what + " has unknown type " + std::to_string(o.type) + " (allowed: 1 bool .. 7 any)";
    opt.type = type_names[o.type];
    if (o.type == HASTEN_OPTION_ENUM) {
      opt.allowed = split_commas(text_or_empty(o.allowed));
      if (opt.allowed.empty()) return what + " is an enum without allowed values";
    } else if (o.allowed != nullptr) {
      return what + " lists allowed values but is not an enum";
    }
    if (o.default_json != nullptr) {
      if (nlohmann::json::parse(o.default_json, nullptr, false).is_discarded())
        return what + " has a default_json that is not JSON: " + o.default_json;
      opt.default_json = o.default_json;
    }
    const bool numeric = o.type == HASTEN_OPTION_INT || o.type == HASTEN_OPTION_FLOAT;
    if ((o.flags & ~(HASTEN_OPTION_HAS_MIN | HASTEN_OPTION_HAS_MAX)) != 0)
      return what + " has unknown flags " + std::to_string(o.flags);
    if (o.flags != 0 && !numeric) return what + " has a range but is not a number";
    if (o.flags & HASTEN_OPTION_HAS_MIN) opt.min = o.min;
    if (o.flags & HASTEN_OPTION_HAS_MAX) opt.max = o.max;
    if (o.section_key != nullptr) {
      if (info.config_section.empty()) return what + " has a section_key but the plugin declares no config_section";
      if (!lower_word(opt.section_key))
        return what + " has an invalid section_key '" + opt.section_key + "' (allowed: 1-64 characters of a-z, 0-9 and '_')";
      if (!section_keys.insert(opt.section_key).second) return "section key '" + opt.section_key + "' is declared twice";
    }
    // Each run setting from the minor that introduced it (an older plugin cannot mean it).
    const uint32_t minor = HASTEN_ABI_VERSION_MINOR(d.abi_version);
    const bool bool_setting = opt.type == "bool" && ((opt.run_setting == "activation_checkpointing" && minor >= 7) ||
                                                     (opt.run_setting == "sharded_init" && minor >= 8));
    if (o.run_setting != nullptr &&
        (o.section_key == nullptr || (opt.run_setting != "gradient_accumulation_steps" && !bool_setting)))
      return what + " declares run_setting '" + opt.run_setting +
             "' (allowed, on a section key: gradient_accumulation_steps; activation_checkpointing, a bool, since "
             "ABI 1.7; sharded_init, a bool, since ABI 1.8)";
    info.options.push_back(std::move(opt));
  }
  return "";
}

}  // namespace hasten::detail
