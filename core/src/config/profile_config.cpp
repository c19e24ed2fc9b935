// The config key `profile`, checked field by field (see profile_config.hpp).
#include "config/profile_config.hpp"

#include <hasten/error.hpp>

namespace hasten::detail {

using json = nlohmann::json;

ProfileSettings parse_profile(const json& value, const std::string& where) {
  ProfileSettings p;
  if (value.is_null() || (value.is_object() && value.empty())) return p;
  if (!value.is_object())
    throw ConfigError("config error: " + where + ": expected a mapping {wait, warmup, active, dir}, got '" + value.dump() +
                      "'");
  p.enabled = true;
  for (auto it = value.begin(); it != value.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    auto steps = [&](int minimum) {
      if (!v.is_number_integer() || v.get<int64_t>() < minimum || v.get<int64_t>() > 1000000)
        throw ConfigError("config error: " + where + ": " + key + " must be an integer from " + std::to_string(minimum) +
                          " to 1000000 (optimizer steps), got '" + v.dump() + "'");
      return static_cast<int>(v.get<int64_t>());
    };
    if (key == "wait") {
      p.wait = steps(0);
    } else if (key == "warmup") {
      p.warmup = steps(0);
    } else if (key == "active") {
      p.active = steps(1);
    } else if (key == "dir") {
      if (!v.is_string() || v.get<std::string>().empty())
        throw ConfigError("config error: " + where + ": dir must be a directory path, got '" + v.dump() + "'");
      p.dir = v.get<std::string>();
    } else {
      throw ConfigError("config error: " + where + ": unknown field '" + key + "' (allowed: wait, warmup, active, dir)");
    }
  }
  return p;
}

}  // namespace hasten::detail
