// Options checked against a plugin's description before its create() runs.
#include "config/described_options.hpp"

#include <sstream>

#include "util/text_util.hpp"

namespace hasten::detail {

using json = nlohmann::json;

namespace {

std::string number(double d) {
  std::ostringstream o;
  o << d;
  return o.str();
}

}  // namespace

std::string allowed_text(const PluginOption& spec) {
  if (spec.type == "enum") return join(spec.allowed, ", ");
  if (spec.min && spec.max) return number(*spec.min) + " to " + number(*spec.max);
  if (spec.min) return ">= " + number(*spec.min);
  if (spec.max) return "<= " + number(*spec.max);
  return "";
}

std::string option_value_error(const PluginOption& spec, const json& v) {
  auto expected = [&](const char* what) { return std::string("expected ") + what + ", got " + v.dump(); };
  double x = 0;
  if (spec.type == "bool") {
    if (!v.is_boolean()) return expected("true or false");
    return "";
  }
  if (spec.type == "int") {
    if (!v.is_number_integer()) return expected("an integer");
    x = static_cast<double>(v.get<int64_t>());
  } else if (spec.type == "float") {
    if (!v.is_number()) return expected("a number");
    x = v.get<double>();
  } else if (spec.type == "string") {
    return v.is_string() ? "" : expected("a string");
  } else if (spec.type == "enum") {
    if (v.is_string())
      for (auto& a : spec.allowed)
        if (a == v.get<std::string>()) return "";
    std::string msg = (v.is_string() ? "'" + v.get<std::string>() + "'" : v.dump()) + " is not allowed (allowed: " +
                      join(spec.allowed, ", ") + ")";
    const std::string near = v.is_string() ? nearest(v.get<std::string>(), spec.allowed) : "";
    if (!near.empty()) msg += "; did you mean '" + near + "'?";
    return msg;
  } else if (spec.type == "list") {
    if (v.is_string()) return "";
    if (!v.is_array()) return expected("a list of strings");
    for (auto& item : v)
      if (!item.is_string()) return expected("a list of strings");
    return "";
  } else {
    return "";  // any: the plugin checks it
  }
  if ((spec.min && x < *spec.min) || (spec.max && x > *spec.max))
    return v.dump() + " is out of range (allowed: " + allowed_text(spec) + ")";
  return "";
}

std::string described_options_error(const PluginInfo& plugin, const json& options) {
  if (!plugin.options_described) return "";
  const std::string who = plugin.name + " options: ";
  if (!options.is_object()) return who + "expected a mapping of options, got " + options.dump();
  std::vector<std::string> names;
  for (auto& o : plugin.options)
    if (!o.name.empty()) names.push_back(o.name);
  for (auto it = options.begin(); it != options.end(); ++it) {
    const PluginOption* spec = nullptr;
    for (auto& o : plugin.options)
      if (!o.name.empty() && o.name == it.key()) spec = &o;
    if (spec == nullptr) {
      std::string msg = who + "unknown key '" + it.key() + "' (allowed: " +
                        (names.empty() ? std::string("none") : join(names, ", ")) + ")";
      const std::string near = nearest(it.key(), names);
      if (!near.empty()) msg += "; did you mean '" + near + "'?";
      return msg;
    }
    if (it.value().is_null()) continue;
    if (const std::string why = option_value_error(*spec, it.value()); !why.empty()) return who + it.key() + ": " + why;
  }
  return "";
}

}  // namespace hasten::detail
