// The configuration rows and distributed_type values that strategy plugins declare.
#include "config/strategy_vocabulary.hpp"

#include <hasten/error.hpp>

namespace hasten::detail {

namespace {

KeyType key_type(const std::string& t) {
  if (t == "bool") return KeyType::Bool;
  if (t == "int") return KeyType::Int;
  if (t == "float") return KeyType::Float;
  if (t == "string") return KeyType::String;
  if (t == "enum") return KeyType::Enum;
  if (t == "list") return KeyType::StringList;
  return KeyType::Any;
}

}  // namespace

StrategyVocabulary strategy_vocabulary(const std::vector<PluginInfo>& plugins) {
  StrategyVocabulary v;
  for (const auto& p : plugins) {
    if (p.kind != PluginKind::Strategy) continue;
    for (const auto& t : p.distributed_types) v.by_distributed_type.emplace(t, p.name);
    if (p.config_section.empty()) continue;
    if (find_spec(core_schema(), p.config_section) != nullptr)
      throw ConfigError("config error: strategy plugin '" + p.name + "' (" + p.file + ") claims the config section '" +
                        p.config_section + "', which is one of hasten's own keys");
    v.section_of[p.name] = p.config_section;
    KeySpec section{p.config_section, KeyType::Section, nullptr, {}, {}, {},
                    "Options of the " + p.name + " strategy (Accelerate's names)"};
    section.strategy = p.name;
    v.rows.push_back(section);
    for (const auto& o : p.options) {
      if (o.section_key.empty()) continue;
      KeySpec row{p.config_section + "." + o.section_key, key_type(o.type), nullptr, o.allowed, o.min, o.max, o.help};
      row.ignored = o.name.empty() && o.run_setting.empty();  // a key that sets nothing
      row.strategy = p.name;
      row.option = o.name;
      row.run_setting = o.run_setting;
      v.rows.push_back(row);
    }
  }
  return v;
}

}  // namespace hasten::detail
