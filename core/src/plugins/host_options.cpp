// The host's option look-ups (ABI 1.1): plugins read their options JSON through these instead
// of parsing it by hand, and unknown keys are errors naming the plugin, the key and the
// allowed ones.
#include "plugins/host_options.hpp"

#include <nlohmann/json.hpp>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "plugins/host_api.hpp"
#include "util/text_util.hpp"

namespace hasten::detail {

namespace {

using json = nlohmann::json;

template <class Fn>
hasten_status guarded(Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::exception& e) {
    return set_host_error(HASTEN_ERR_INTERNAL, e.what());
  } catch (...) {
    return set_host_error(HASTEN_ERR_INTERNAL, "unknown exception in the host");
  }
}

// The options object; false (with the error set) when the text is not a JSON object.
bool parse(const char* text, json& out) {
  out = json::parse(text != nullptr ? text : "{}", nullptr, false);
  if (out.is_null()) out = json::object();
  if (out.is_discarded() || !out.is_object()) {
    set_host_error(HASTEN_ERR_INVALID_ARGUMENT, std::string("options are not a JSON object: ") + (text ? text : ""));
    return false;
  }
  return true;
}

// Finds key; returns nullptr (and *found = 0) when absent.
const json* lookup(const json& o, const char* key, int32_t* found) {
  const auto it = key != nullptr ? o.find(key) : o.end();
  const bool has = it != o.end() && !it->is_null();
  if (found != nullptr) *found = has ? 1 : 0;
  return has ? &*it : nullptr;
}

hasten_status wrong(const char* key, const json& v, const char* wanted) {
  return set_host_error(HASTEN_ERR_INVALID_ARGUMENT,
                        std::string("option ") + key + ": expected " + wanted + ", got " + v.dump());
}

hasten_status copy_out(const std::string& s, char* buffer, size_t capacity, size_t* size) {
  if (size != nullptr) *size = s.size() + 1;
  if (capacity < s.size() + 1)
    return capacity == 0 ? HASTEN_OK
                         : set_host_error(HASTEN_ERR_INVALID_ARGUMENT,
                                          "option value needs " + std::to_string(s.size() + 1) + " bytes");
  std::memcpy(buffer, s.c_str(), s.size() + 1);
  return HASTEN_OK;
}

hasten_status options_check(const hasten_host_api*, const char* plugin, const char* options_json,
                            const char* allowed) noexcept {
  return guarded([&]() -> hasten_status {
    json o;
    if (!parse(options_json, o)) return HASTEN_ERR_INVALID_ARGUMENT;
    std::vector<std::string> keys;
    std::stringstream ss(allowed != nullptr ? allowed : "");
    for (std::string k; std::getline(ss, k, ',');)
      if (!trim(k).empty()) keys.push_back(trim(k));
    for (auto it = o.begin(); it != o.end(); ++it) {
      bool ok = false;
      for (auto& k : keys) ok = ok || k == it.key();
      if (ok) continue;
      std::string msg = std::string(plugin != nullptr ? plugin : "plugin") + " options: unknown key '" + it.key() +
                        "' (allowed: " + (keys.empty() ? std::string("none") : join(keys, ", ")) + ")";
      const std::string near = nearest(it.key(), keys);
      if (!near.empty()) msg += "; did you mean '" + near + "'?";
      return set_host_error(HASTEN_ERR_INVALID_ARGUMENT, msg);
    }
    return HASTEN_OK;
  });
}

// Parses the options, finds key and hands its value to read(value); an absent (or null) key
// is HASTEN_OK with *found = 0. Every typed look-up below is one read.
template <class Read>
hasten_status with_option(const char* options_json, const char* key, int32_t* found, Read&& read) noexcept {
  return guarded([&]() -> hasten_status {
    json o;
    if (!parse(options_json, o)) return HASTEN_ERR_INVALID_ARGUMENT;
    const json* v = lookup(o, key, found);
    return v == nullptr ? HASTEN_OK : read(*v);
  });
}

hasten_status option_bool(const hasten_host_api*, const char* options_json, const char* key, int32_t* value,
                          int32_t* found) noexcept {
  return with_option(options_json, key, found, [&](const json& v) -> hasten_status {
    if (!v.is_boolean()) return wrong(key, v, "true or false");
    *value = v.get<bool>() ? 1 : 0;
    return HASTEN_OK;
  });
}

hasten_status option_int(const hasten_host_api*, const char* options_json, const char* key, int64_t* value,
                         int32_t* found) noexcept {
  return with_option(options_json, key, found, [&](const json& v) -> hasten_status {
    if (!v.is_number_integer()) return wrong(key, v, "an integer");
    *value = v.get<int64_t>();
    return HASTEN_OK;
  });
}

hasten_status option_float(const hasten_host_api*, const char* options_json, const char* key, double* value,
                           int32_t* found) noexcept {
  return with_option(options_json, key, found, [&](const json& v) -> hasten_status {
    if (!v.is_number()) return wrong(key, v, "a number");
    *value = v.get<double>();
    return HASTEN_OK;
  });
}

hasten_status option_string(const hasten_host_api*, const char* options_json, const char* key, char* buffer,
                            size_t capacity, size_t* size, int32_t* found) noexcept {
  return with_option(options_json, key, found, [&](const json& v) -> hasten_status {
    if (!v.is_string()) return wrong(key, v, "a string");
    return copy_out(v.get<std::string>(), buffer, capacity, size);
  });
}

hasten_status option_list_item(const hasten_host_api*, const char* options_json, const char* key, uint32_t index,
                               char* buffer, size_t capacity, size_t* size, uint32_t* count,
                               int32_t* found) noexcept {
  if (count != nullptr) *count = 0;
  return with_option(options_json, key, found, [&](const json& v) -> hasten_status {
    std::vector<std::string> items;
    if (v.is_string()) {
      items.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      for (auto& item : v) {
        if (!item.is_string()) return wrong(key, v, "a list of strings");
        items.push_back(item.get<std::string>());
      }
    } else {
      return wrong(key, v, "a list of strings");
    }
    if (count != nullptr) *count = static_cast<uint32_t>(items.size());
    if (index >= items.size())
      return capacity == 0 ? HASTEN_OK
                           : set_host_error(HASTEN_ERR_INVALID_ARGUMENT, std::string("option ") + key + ": item " +
                                                                             std::to_string(index) + " of " +
                                                                             std::to_string(items.size()));
    return copy_out(items[index], buffer, capacity, size);
  });
}

}  // namespace

void install_option_lookups(hasten_host_api& api) {
  api.options_check = &options_check;
  api.option_bool = &option_bool;
  api.option_int = &option_int;
  api.option_float = &option_float;
  api.option_string = &option_string;
  api.option_list_item = &option_list_item;
}

}  // namespace hasten::detail
