// C++ helpers for writing hasten plugins, C tier (no LibTorch): base classes of trackers and
// comm backends, the export macro, guards that turn exceptions into status codes, options.
// Strategies and precisions (torch tier) include <hasten/plugin_torch.hpp>, which adds the
// LibTorch parts to this; <hasten/plugin_optimizer_state.hpp> reads and writes optimizer state
// by parameter.
//
// Header-only; nothing here is ABI: every type lives in an inline versioned namespace and
// only the C structs of plugin.h cross the boundary.
//
// A whole tracker plugin (tests/abi/header_examples.py compiles the lines between the
// example markers):
// example begin
//   #include <hasten/plugin.hpp>
//   #include <cstdio>
//   struct MyTracker : hasten::sdk::Tracker {
//     MyTracker(const hasten_host_api* host, std::string_view options) : Tracker(host) {
//       hasten::sdk::require_no_options(options, "mytracker");
//     }
//     void start(const hasten_tracker_run& run) override { std::printf("%s\n", run.project); }
//     void log_scalars(const hasten_scalar* v, uint32_t n, int64_t step) override {
//       for (uint32_t i = 0; i < n; ++i) std::printf("%lld %s %g\n", (long long)step, v[i].name, v[i].value);
//     }
//   };
//   static constexpr hasten_plugin_descriptor kMine =
//       hasten::sdk::tracker_descriptor<MyTracker>("mytracker", "1.0", "prints scalars");
//   HASTEN_PLUGIN_LIBRARY(&kMine)
// example end
#ifndef HASTEN_PLUGIN_HPP
#define HASTEN_PLUGIN_HPP

#include <hasten/plugin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <vector>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>


namespace hasten::sdk {
inline namespace v1 {

// An error with the status it maps to. Throw it from plugin code; the guards turn it into
// its status and message. Any other std::exception becomes HASTEN_ERR_INTERNAL.
class Error : public std::runtime_error {
 public:
  Error(hasten_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  hasten_status status() const noexcept { return status_; }

 private:
  hasten_status status_;
};

// Runs fn; converts any exception into a status and reports its message through the host.
template <class Fn>
hasten_status guard(const hasten_host_api* host, Fn&& fn) noexcept {
  auto report = [host](const char* message) {
    if (host != nullptr && host->set_error != nullptr) host->set_error(host, message);
  };
  try {
    if constexpr (std::is_same_v<decltype(fn()), hasten_status>) {
      return fn();
    } else {
      fn();
      return HASTEN_OK;
    }
  } catch (const Error& e) {
    if (e.what()[0] != '\0') report(e.what());  // empty: a status passed through, its message already set
    return e.status();
  } catch (const std::bad_alloc&) {
    report("out of memory");
    return HASTEN_ERR_SYSTEM;
  } catch (const std::exception& e) {
    report(e.what());
    return HASTEN_ERR_INTERNAL;
  } catch (...) {
    report("unknown exception");
    return HASTEN_ERR_INTERNAL;
  }
}

// Logging into the host's log.
inline void log(const hasten_host_api* host, hasten_log_level level, const char* plugin,
                const std::string& message) noexcept {
  if (host != nullptr && host->log != nullptr) host->log(host, level, plugin, message.c_str());
}

// The host's process information.
inline hasten_process_info process_info(const hasten_host_api* host) {
  hasten_process_info info{};
  info.struct_size = sizeof(info);
  info.abi_version = HASTEN_ABI_VERSION;
  info.world_size = 1;
  info.local_world_size = 1;
  info.num_nodes = 1;
  if (host != nullptr && host->process_info != nullptr) host->process_info(host, &info);
  return info;
}

// Throws the host's message when a host call failed.
inline void check(const hasten_host_api* host, hasten_status status, const char* what) {
  if (status == HASTEN_OK) return;
  std::string message = std::string(what) + " failed";
  if (host != nullptr && host->struct_size > offsetof(hasten_host_api, last_error) && host->last_error)
    message += ": " + std::string(host->last_error(host));
  throw Error(status, message);
}

// ABI 1.11: this rank's group along a dimension of the run's device mesh (host->group: "dp_replicate",
// "dp_shard", "cp", "tp", "dp"); nullopt from a host before 1.11, which has no mesh (every
// collective runs over every rank).
struct MeshGroup {
  const hasten_group* handle = nullptr;  // for hasten_coll_options.group
  int32_t rank = 0;                      // this rank's place in the group
  int32_t size = 1;
};
inline std::optional<MeshGroup> mesh_group(const hasten_host_api* host, const char* name) {
  if (host == nullptr || host->struct_size < offsetof(hasten_host_api, group) + sizeof(host->group) || host->group == nullptr)
    return std::nullopt;
  MeshGroup g;
  check(host, host->group(host, name, &g.handle, &g.rank, &g.size), "host->group");
  return g;
}
// Options that run a host collective over `group` (NULL: every rank).
inline hasten_coll_options group_options(const hasten_group* group) {
  hasten_coll_options o{};
  o.struct_size = sizeof(o);
  o.abi_version = HASTEN_ABI_VERSION;
  o.group = group;
  return o;
}

// Reduces one number across every rank (or the ranks of `group`) through the host's
// collectives (the identity in a one-process run). For the few decisions all ranks must share:
// a loss scaler's "found inf/nan", a global gradient norm.
inline double allreduce_scalar(const hasten_host_api* host, double value, hasten_reduce_op op,
                               const hasten_group* group = nullptr) {
  if (process_info(host).world_size <= 1) return value;
  int64_t shape[1] = {1};
  DLTensor t{};
  t.data = &value;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {kDLFloat, 64, 1};
  t.shape = shape;
  const hasten_coll_options o = group_options(group);
  check(host, host->allreduce(host, &t, op, group != nullptr ? &o : nullptr, nullptr), "scalar allreduce");
  return value;
}

// Plugins without options accept only an empty JSON object.
inline void require_no_options(std::string_view options_json, const std::string& plugin) {
  if (options_json != "{}" && options_json != "null" && !options_json.empty())
    throw Error(HASTEN_ERR_INVALID_ARGUMENT, plugin + " takes no options, got " + std::string(options_json));
}

// A plugin's options read through the host's look-ups (ABI 1.1), so that no plugin parses
// JSON by hand: the constructor refuses a key not in `allowed` (the message names the plugin,
// the key and the allowed ones); each getter returns std::nullopt for an absent key and
// throws Error with the host's message for a value of another type.
//   Options o(host, options_json, "shm", {"buffer_mb"});
//   if (auto mb = o.number("buffer_mb")) ...
// Built with the plugin's described options (the array its descriptor points to), a getter
// returns an absent key's default_json instead, so that a default lives once, in the
// description `hasten plugins describe` prints:
//   Options o(host, options_json, kDdpOptions);
//   const double mb = *o.number("bucket_cap_mb");   // 25 unless set
class Options {
 public:
  // For a plugin whose descriptor describes its options (ABI 1.2): the host has already
  // refused unknown keys and values of the wrong type, so only the look-ups remain.
  Options(const hasten_host_api* host, std::string_view options_json)
      : host_(host), text_(options_json.empty() ? std::string("{}") : std::string(options_json)) {}
  // The same, with the described defaults (`specs` is static: the descriptor's array).
  template <size_t N>
  Options(const hasten_host_api* host, std::string_view options_json, const hasten_option_spec (&specs)[N])
      : Options(host, options_json, specs, N) {}
  Options(const hasten_host_api* host, std::string_view options_json, const hasten_option_spec* specs, size_t n_specs)
      : Options(host, options_json) {
    specs_ = specs;
    n_specs_ = n_specs;
  }
  Options(const hasten_host_api* host, std::string_view options_json, const std::string& plugin,
          std::initializer_list<const char*> allowed)
      : host_(host), text_(options_json.empty() ? std::string("{}") : std::string(options_json)) {
    std::string keys;
    for (const char* k : allowed) keys += (keys.empty() ? "" : ",") + std::string(k);
    require(offsetof(hasten_host_api, options_check), host_ != nullptr ? (const void*)host_->options_check : nullptr);
    ok(host_->options_check(host_, plugin.c_str(), text_.c_str(), keys.c_str()));
  }
  std::optional<bool> boolean(const char* key) const {
    int32_t v = 0, found = 0;
    require(offsetof(hasten_host_api, option_bool), (const void*)host_->option_bool);
    ok(host_->option_bool(host_, text_.c_str(), key, &v, &found));
    if (!found && !default_doc(key).empty()) ok(host_->option_bool(host_, default_doc(key).c_str(), key, &v, &found));
    return found ? std::optional<bool>(v != 0) : std::nullopt;
  }
  std::optional<int64_t> integer(const char* key) const {
    int64_t v = 0;
    int32_t found = 0;
    require(offsetof(hasten_host_api, option_int), (const void*)host_->option_int);
    ok(host_->option_int(host_, text_.c_str(), key, &v, &found));
    if (!found && !default_doc(key).empty()) ok(host_->option_int(host_, default_doc(key).c_str(), key, &v, &found));
    return found ? std::optional<int64_t>(v) : std::nullopt;
  }
  std::optional<double> number(const char* key) const {
    double v = 0;
    int32_t found = 0;
    require(offsetof(hasten_host_api, option_float), (const void*)host_->option_float);
    ok(host_->option_float(host_, text_.c_str(), key, &v, &found));
    if (!found && !default_doc(key).empty()) ok(host_->option_float(host_, default_doc(key).c_str(), key, &v, &found));
    return found ? std::optional<double>(v) : std::nullopt;
  }
  std::optional<std::string> text(const char* key) const {
    size_t size = 0;
    int32_t found = 0;
    require(offsetof(hasten_host_api, option_string), (const void*)host_->option_string);
    const std::string* doc = &text_;
    ok(host_->option_string(host_, doc->c_str(), key, nullptr, 0, &size, &found));
    if (!found && !default_doc(key).empty()) {
      doc = &default_doc(key);
      ok(host_->option_string(host_, doc->c_str(), key, nullptr, 0, &size, &found));
    }
    if (!found) return std::nullopt;
    std::string out(size, '\0');
    ok(host_->option_string(host_, doc->c_str(), key, out.data(), out.size(), &size, &found));
    out.resize(size - 1);
    return out;
  }
  std::optional<std::vector<std::string>> list(const char* key) const {
    size_t size = 0;
    uint32_t count = 0;
    int32_t found = 0;
    require(offsetof(hasten_host_api, option_list_item), (const void*)host_->option_list_item);
    ok(host_->option_list_item(host_, text_.c_str(), key, 0, nullptr, 0, &size, &count, &found));
    if (!found) return std::nullopt;
    std::vector<std::string> items;
    for (uint32_t i = 0; i < count; ++i) {
      ok(host_->option_list_item(host_, text_.c_str(), key, i, nullptr, 0, &size, &count, &found));
      std::string item(size, '\0');
      ok(host_->option_list_item(host_, text_.c_str(), key, i, item.data(), item.size(), &size, &count, &found));
      item.resize(size - 1);
      items.push_back(std::move(item));
    }
    return items;
  }

 private:
  // Throws the host's own message (it names the plugin or the key, the value and the type).
  void ok(hasten_status status) const {
    if (status != HASTEN_OK) throw Error(status, host_->last_error != nullptr ? host_->last_error(host_) : "option look-up failed");
  }
  // A 1.0 host has no look-ups: say so rather than call past the end of its table.
  void require(size_t offset, const void* slot) const {
    if (host_ == nullptr || host_->struct_size <= offset || slot == nullptr)
      throw Error(HASTEN_ERR_UNSUPPORTED, "this hasten host has no option look-ups (ABI 1.1 needed)");
  }
  // {"key": default_json} of a described key, "" for one without a default (or no specs):
  // the host's own look-ups then read the default as they read the options.
  const std::string& default_doc(const char* key) const {
    if (auto it = defaults_.find(key); it != defaults_.end()) return it->second;
    for (size_t i = 0; i < n_specs_; ++i) {
      const hasten_option_spec& s = specs_[i];
      if (s.name != nullptr && s.default_json != nullptr && std::string_view(s.name) == key) {
        return defaults_[key] = "{\"" + std::string(key) + "\": " + s.default_json + "}";
      }
    }
    static const std::string none;
    return none;
  }
  const hasten_host_api* host_;
  std::string text_;
  const hasten_option_spec* specs_ = nullptr;
  size_t n_specs_ = 0;
  mutable std::map<std::string, std::string> defaults_;  // key -> its default document, made once
};

// Common base of every plugin instance: holds the host table (static, never owned).
class PluginBase {
 public:
  explicit PluginBase(const hasten_host_api* host) : host_(host) {}
  virtual ~PluginBase() = default;
  PluginBase(const PluginBase&) = delete;
  PluginBase& operator=(const PluginBase&) = delete;
  const hasten_host_api* host() const noexcept { return host_; }

 private:
  const hasten_host_api* host_;
};

namespace detail {

template <class Base>
inline Base* self(hasten_instance* inst) noexcept {
  return reinterpret_cast<Base*>(inst);
}

// create() for any kind: constructs T(host, options_json) behind the guard.
template <class T, class Base>
hasten_status create(const hasten_host_api* host, const char* options_json,
                     hasten_instance** out) noexcept {
  return guard(host, [&] {
    if (out == nullptr) throw Error(HASTEN_ERR_INVALID_ARGUMENT, "create: out is NULL");
    std::string_view options = options_json != nullptr ? options_json : "{}";
    Base* object = new T(host, options);
    *out = reinterpret_cast<hasten_instance*>(object);
  });
}

template <class Base>
void destroy(hasten_instance* inst) noexcept {
  try {
    delete self<Base>(inst);
  } catch (...) {  // a destructor that throws must not take the host down
  }
}

// Calls a member behind the guard, reporting through the instance's host.
template <class Base, class Fn>
hasten_status call(hasten_instance* inst, Fn&& fn) noexcept {
  Base* object = self<Base>(inst);
  return guard(object != nullptr ? object->host() : nullptr, [&] { fn(*object); });
}

}  // namespace detail

// Fills a descriptor; kind-specific helpers below supply the vtable.
constexpr hasten_plugin_descriptor make_descriptor(hasten_plugin_kind kind, const char* name,
                                                   const char* version,
                                                   const char* description,
                                                   const void* vtable,
                                                   const char* torch_fingerprint = nullptr,
                                                   const hasten_preset* presets = nullptr,
                                                   uint32_t n_presets = 0) {
  return hasten_plugin_descriptor{HASTEN_STRUCT_INIT(hasten_plugin_descriptor),
                                  kind,
                                  name,
                                  version,
                                  description,
                                  torch_fingerprint,
                                  presets,
                                  n_presets,
                                  vtable,
                                  nullptr,
                                  0,
                                  nullptr,
                                  nullptr};
}

// One described option (ABI 1.2 hasten_option_spec), built in a constant expression:
//   constexpr hasten_option_spec kOptions[] = {
//       sdk::OptionSpec("stage", HASTEN_OPTION_INT, "ZeRO stage").range(0, 3).default_json("0")
//           .section_key("zero_stage"),
//   };
class OptionSpec {
  // Defined before its callers: Clang (14) evaluates a constexpr call of a member template only
  // once its definition has been seen, even inside the completed class.
  template <class Fn>
  constexpr OptionSpec with(Fn&& fn) const {
    OptionSpec copy = *this;
    fn(copy.s_);
    return copy;
  }

 public:
  constexpr OptionSpec(const char* name, hasten_option_type type, const char* help)
      : s_{HASTEN_STRUCT_INIT(hasten_option_spec), name, type, nullptr, nullptr, help, 0, 0.0, 0.0, nullptr, nullptr} {}
  // ENUM: the allowed values, comma-separated.
  constexpr OptionSpec allowed(const char* values) const { return with([&](hasten_option_spec& s) { s.allowed = values; }); }
  // The value used when the key is absent, as JSON text.
  constexpr OptionSpec default_json(const char* json) const { return with([&](hasten_option_spec& s) { s.default_json = json; }); }
  constexpr OptionSpec min(double v) const {
    return with([&](hasten_option_spec& s) { s.min = v, s.flags |= HASTEN_OPTION_HAS_MIN; });
  }
  constexpr OptionSpec max(double v) const {
    return with([&](hasten_option_spec& s) { s.max = v, s.flags |= HASTEN_OPTION_HAS_MAX; });
  }
  constexpr OptionSpec range(double lo, double hi) const { return min(lo).max(hi); }
  // Strategies: the key of the plugin's config section (Accelerate's name) that sets it.
  constexpr OptionSpec section_key(const char* key) const { return with([&](hasten_option_spec& s) { s.section_key = key; }); }
  // Strategies: the run setting the section key also sets ("gradient_accumulation_steps").
  constexpr OptionSpec run_setting(const char* key) const { return with([&](hasten_option_spec& s) { s.run_setting = key; }); }
  constexpr operator hasten_option_spec() const { return s_; }  // NOLINT: meant to convert

 private:
  hasten_option_spec s_;
};

// Strategies: a key of the config section that sets no option (Accelerate's, no effect here).
constexpr OptionSpec section_only_key(const char* key, hasten_option_type type, const char* help) {
  return OptionSpec(nullptr, type, help).section_key(key);
}

// Describes a descriptor's options: the host checks them before create() and `hasten
// plugins describe` prints them.
template <size_t N>
constexpr hasten_plugin_descriptor with_options(hasten_plugin_descriptor d, const hasten_option_spec (&specs)[N]) {
  d.options = specs;
  d.n_options = static_cast<uint32_t>(N);
  return d;
}

// Describes a plugin that takes no options: the host refuses any key before create().
inline constexpr hasten_option_spec kNoOptionsSentinel[1] = {OptionSpec("none", HASTEN_OPTION_ANY, "")};
constexpr hasten_plugin_descriptor without_options(hasten_plugin_descriptor d) {
  d.options = kNoOptionsSentinel;
  d.n_options = 0;
  return d;
}

// Strategies: the distributed_type values that select it ("MULTI_CPU,MULTI_GPU") and the
// config section it owns ("fsdp_config", or nullptr).
constexpr hasten_plugin_descriptor answering(hasten_plugin_descriptor d, const char* distributed_types,
                                             const char* config_section = nullptr) {
  d.distributed_types = distributed_types;
  d.config_section = config_section;
  return d;
}

constexpr hasten_preset make_preset(const char* name, const char* description,
                                    const char* options_json) {
  return hasten_preset{HASTEN_STRUCT_INIT(hasten_preset), name, description, options_json};
}

// True when Derived declares its own Method (rather than inheriting Base's): such slots are
// filled, the others stay NULL so the host skips the crossing entirely.
#define HASTEN_SDK_OVERRIDES(Derived, Base, method) \
  (!std::is_same_v<decltype(&Derived::method), decltype(&Base::method)>)

// ------------------------------------------------------------------------------------------
// Tracker (C tier)
// ------------------------------------------------------------------------------------------
class Tracker : public PluginBase {
 public:
  using PluginBase::PluginBase;
  virtual void start(const hasten_tracker_run& run) = 0;
  virtual void log_scalars(const hasten_scalar* values, uint32_t n, int64_t step) = 0;
  virtual void log_text(const char* name, const char* text, int64_t step) {
    (void)name, (void)text, (void)step;
  }
  virtual void flush() {}
  virtual void finish(hasten_status status) { (void)status; }
  // 1.9 (each optional; a tracker that overrides one gets the slot).
  virtual void log_image(const char* name, const uint8_t* pixels, uint32_t height, uint32_t width, uint32_t channels,
                         int64_t step) {
    (void)name, (void)pixels, (void)height, (void)width, (void)channels, (void)step;
  }
  virtual void log_histogram(const char* name, const double* values, uint64_t n, int64_t step) {
    (void)name, (void)values, (void)n, (void)step;
  }
  virtual void log_table(const char* name, const char* table_json, int64_t step) {
    (void)name, (void)table_json, (void)step;
  }
  // 1.10: the text of one JSON object of strings naming the run (hasten_tracker_vtable.run_info).
  virtual std::string run_info() { return "{}"; }
  // The slot's side: run_info() kept here, so the host's pointer lives until the next call.
  const char* run_info_for_host() {
    run_info_text_ = run_info();
    return run_info_text_.c_str();
  }

 private:
  std::string run_info_text_;  // what the run_info slot hands the host, kept until the next call
};

template <class T>
constexpr hasten_tracker_vtable make_tracker_vtable() {
  static_assert(std::is_base_of_v<Tracker, T>, "T must derive from hasten::sdk::Tracker");
  hasten_tracker_vtable vt{};
  vt.struct_size = sizeof(vt);
  vt.abi_version = HASTEN_ABI_VERSION;
  vt.create = &detail::create<T, Tracker>;
  vt.destroy = &detail::destroy<Tracker>;
  vt.start = [](hasten_instance* i, const hasten_tracker_run* run) noexcept {
    return detail::call<Tracker>(i, [&](Tracker& t) { t.start(*run); });
  };
  vt.log_scalars = [](hasten_instance* i, const hasten_scalar* v, uint32_t n,
                      int64_t step) noexcept {
    return detail::call<Tracker>(i, [&](Tracker& t) { t.log_scalars(v, n, step); });
  };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Tracker, log_text))
    vt.log_text = [](hasten_instance* i, const char* name, const char* text,
                     int64_t step) noexcept {
      return detail::call<Tracker>(i, [&](Tracker& t) { t.log_text(name, text, step); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Tracker, flush))
    vt.flush = [](hasten_instance* i) noexcept {
      return detail::call<Tracker>(i, [&](Tracker& t) { t.flush(); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Tracker, finish))
    vt.finish = [](hasten_instance* i, hasten_status s) noexcept {
      return detail::call<Tracker>(i, [&](Tracker& t) { t.finish(s); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Tracker, log_image))
    vt.log_image = [](hasten_instance* i, const char* name, const uint8_t* pixels, uint32_t h, uint32_t w, uint32_t c,
                      int64_t step) noexcept {
      return detail::call<Tracker>(i, [&](Tracker& t) { t.log_image(name, pixels, h, w, c, step); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Tracker, log_histogram))
    vt.log_histogram = [](hasten_instance* i, const char* name, const double* values, uint64_t n, int64_t step) noexcept {
      return detail::call<Tracker>(i, [&](Tracker& t) { t.log_histogram(name, values, n, step); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Tracker, log_table))
    vt.log_table = [](hasten_instance* i, const char* name, const char* table, int64_t step) noexcept {
      return detail::call<Tracker>(i, [&](Tracker& t) { t.log_table(name, table, step); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Tracker, run_info))
    vt.run_info = [](hasten_instance* i, const char** json_out) noexcept {
      return detail::call<Tracker>(i, [&](Tracker& t) { *json_out = t.run_info_for_host(); });
    };
  return vt;
}
template <class T>
inline constexpr hasten_tracker_vtable tracker_vtable = make_tracker_vtable<T>();

template <class T>
constexpr hasten_plugin_descriptor tracker_descriptor(const char* name, const char* version,
                                                      const char* description) {
  return make_descriptor(HASTEN_KIND_TRACKER, name, version, description, &tracker_vtable<T>);
}

// ------------------------------------------------------------------------------------------
// Comm (C tier). Work items are whatever the subclass allocates; it frees them.
// ------------------------------------------------------------------------------------------
class Comm : public PluginBase {
 public:
  using PluginBase::PluginBase;
  virtual void init(const hasten_comm_init& init) = 0;
  virtual bool supports_device(int32_t device_type) = 0;
  virtual hasten_work* allreduce(DLTensor& buffer, hasten_reduce_op op,
                                 const hasten_coll_options* options) = 0;
  virtual hasten_work* allgather(const DLTensor& input, DLTensor& output,
                                 const hasten_coll_options* options) = 0;
  virtual hasten_work* reduce_scatter(const DLTensor& input, DLTensor& output,
                                      hasten_reduce_op op, const hasten_coll_options* options) {
    (void)input, (void)output, (void)op, (void)options;
    throw Error(HASTEN_ERR_UNSUPPORTED, "reduce_scatter is not supported");
  }
  virtual hasten_work* broadcast(DLTensor& buffer, int32_t root,
                                 const hasten_coll_options* options) = 0;
  virtual hasten_work* barrier(const hasten_coll_options* options) = 0;
  virtual void wait(hasten_work* work, int64_t timeout_ms) = 0;
  // Override to answer work_test (never blocking); without it the slot stays NULL and the
  // host learns of completion through wait.
  virtual bool test(hasten_work* work) {
    (void)work;
    return false;
  }
  // ABI 1.6, CUDA backends: override to answer work_wait_stream (enqueue on `stream`, a
  // cudaStream_t or NULL for the legacy default stream, a wait for work and return without
  // blocking; plugin.h, "Stream-ordered waits"). Without it the slot stays NULL and the host
  // blocks in wait.
  virtual void wait_stream(hasten_work* work, void* stream) {
    (void)work, (void)stream;
    throw Error(HASTEN_ERR_UNSUPPORTED, "work_wait_stream is not supported");
  }
  virtual void free_work(hasten_work* work) noexcept = 0;
  virtual void abort() noexcept {}
  // ABI 1.11: override to answer split (process groups): return a new, connected instance of
  // the plugin's class over the group `split` names (plugin.h, comm slot split); the host owns
  // and destroys it. Without it the slot stays NULL and the host refuses meshes that need groups.
  virtual Comm* split(const hasten_comm_split& split) {
    (void)split;
    throw Error(HASTEN_ERR_UNSUPPORTED, "split is not supported");
  }
};

namespace detail {
// A comm class may declare what it serves (ABI 1.1):
//   static constexpr int32_t kDevices[] = {kDLCPU};
//   static constexpr hasten_comm_serves serves = hasten::sdk::comm_serves(kDevices, HASTEN_COMM_SCOPE_ANY, 10);
template <class T, class = void>
struct declares_serves : std::false_type {};
template <class T>
struct declares_serves<T, std::void_t<decltype(&T::serves)>> : std::true_type {};
}  // namespace detail

template <size_t N>
constexpr hasten_comm_serves comm_serves(const int32_t (&device_types)[N], int32_t scope, int32_t priority) {
  return hasten_comm_serves{HASTEN_STRUCT_INIT(hasten_comm_serves), device_types, static_cast<uint32_t>(N),
                            scope, priority};
}

template <class T>
constexpr hasten_comm_vtable make_comm_vtable() {
  static_assert(std::is_base_of_v<Comm, T>, "T must derive from hasten::sdk::Comm");
  hasten_comm_vtable vt{};
  vt.struct_size = sizeof(vt);
  vt.abi_version = HASTEN_ABI_VERSION;
  vt.create = &detail::create<T, Comm>;
  vt.destroy = &detail::destroy<Comm>;
  vt.init = [](hasten_instance* i, const hasten_comm_init* init) noexcept {
    // An older host passes a shorter struct: the fields it did not know read as 0, except
    // device_id (1.6), where 0 is a device: it reads as -1, "none picked". struct_size stays
    // the host's.
    hasten_comm_init mine{};
    std::memcpy(&mine, init, init->struct_size < sizeof mine ? init->struct_size : sizeof mine);
    if (init->struct_size < offsetof(hasten_comm_init, device_id) + sizeof(int32_t)) mine.device_id = -1;
    return detail::call<Comm>(i, [&](Comm& c) { c.init(mine); });
  };
  vt.supports_device = [](hasten_instance* i, int32_t device_type) noexcept -> int32_t {
    try {
      return detail::self<Comm>(i)->supports_device(device_type) ? 1 : 0;
    } catch (...) {
      return 0;
    }
  };
  vt.allreduce = [](hasten_instance* i, DLTensor* b, int32_t op,
                    const hasten_coll_options* o, hasten_work** w) noexcept {
    return detail::call<Comm>(
        i, [&](Comm& c) { *w = c.allreduce(*b, static_cast<hasten_reduce_op>(op), o); });
  };
  vt.allgather = [](hasten_instance* i, const DLTensor* in, DLTensor* out,
                    const hasten_coll_options* o, hasten_work** w) noexcept {
    return detail::call<Comm>(i, [&](Comm& c) { *w = c.allgather(*in, *out, o); });
  };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Comm, reduce_scatter))
    vt.reduce_scatter = [](hasten_instance* i, const DLTensor* in, DLTensor* out, int32_t op,
                           const hasten_coll_options* o, hasten_work** w) noexcept {
      return detail::call<Comm>(i, [&](Comm& c) {
        *w = c.reduce_scatter(*in, *out, static_cast<hasten_reduce_op>(op), o);
      });
    };
  vt.broadcast = [](hasten_instance* i, DLTensor* b, int32_t root,
                    const hasten_coll_options* o, hasten_work** w) noexcept {
    return detail::call<Comm>(i, [&](Comm& c) { *w = c.broadcast(*b, root, o); });
  };
  vt.barrier = [](hasten_instance* i, const hasten_coll_options* o, hasten_work** w) noexcept {
    return detail::call<Comm>(i, [&](Comm& c) { *w = c.barrier(o); });
  };
  vt.work_wait = [](hasten_instance* i, hasten_work* w, int64_t timeout_ms) noexcept {
    return detail::call<Comm>(i, [&](Comm& c) { c.wait(w, timeout_ms); });
  };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Comm, test))
    vt.work_test = [](hasten_instance* i, hasten_work* w, int32_t* done) noexcept {
      return detail::call<Comm>(i, [&](Comm& c) { *done = c.test(w) ? 1 : 0; });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Comm, wait_stream))
    vt.work_wait_stream = [](hasten_instance* i, hasten_work* w, void* stream) noexcept {
      return detail::call<Comm>(i, [&](Comm& c) { c.wait_stream(w, stream); });
    };
  vt.work_free = [](hasten_instance* i, hasten_work* w) noexcept {
    detail::self<Comm>(i)->free_work(w);
  };
  vt.abort = [](hasten_instance* i) noexcept { detail::self<Comm>(i)->abort(); };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Comm, split))
    vt.split = [](hasten_instance* i, const hasten_comm_split* s, hasten_instance** out) noexcept {
      return detail::call<Comm>(i, [&](Comm& c) {
        if (s == nullptr || out == nullptr) throw Error(HASTEN_ERR_INVALID_ARGUMENT, "split: split or out is NULL");
        hasten_comm_split mine{};
        std::memcpy(&mine, s, s->struct_size < sizeof mine ? s->struct_size : sizeof mine);
        if (mine.color < 0 || mine.size < 1 || mine.rank < 0 || mine.rank >= mine.size)
          throw Error(HASTEN_ERR_INVALID_ARGUMENT, "split: color " + std::to_string(mine.color) + ", rank " +
                                                       std::to_string(mine.rank) + " of " + std::to_string(mine.size) +
                                                       " (allowed: color >= 0, 0 <= rank < size)");
        *out = reinterpret_cast<hasten_instance*>(c.split(mine));
      });
    };
  if constexpr (detail::declares_serves<T>::value) vt.serves = &T::serves;
  return vt;
}
template <class T>
inline constexpr hasten_comm_vtable comm_vtable = make_comm_vtable<T>();

template <class T>
constexpr hasten_plugin_descriptor comm_descriptor(const char* name, const char* version,
                                                   const char* description) {
  return make_descriptor(HASTEN_KIND_COMM, name, version, description, &comm_vtable<T>);
}


}  // namespace v1
}  // namespace hasten::sdk

// Defines the library's entry point over the given descriptors (constant expressions or
// names of static hasten_plugin_descriptor objects, by address):
//   static constexpr auto kCsv = hasten::sdk::tracker_descriptor<Csv>("csv", "1.0", "...");
//   HASTEN_PLUGIN_LIBRARY(&kCsv)
#define HASTEN_PLUGIN_LIBRARY(...)                                                          \
  extern "C" HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(                    \
      const hasten_host_api* host, uint32_t host_abi,                                       \
      const hasten_plugin_descriptor* const** out, uint32_t* count) {                       \
    static const hasten_plugin_descriptor* const hasten_sdk_list[] = {__VA_ARGS__};         \
    (void)host;                                                                             \
    if (HASTEN_ABI_VERSION_MAJOR(host_abi) != HASTEN_ABI_MAJOR) return HASTEN_ERR_UNSUPPORTED; \
    *out = hasten_sdk_list;                                                                 \
    *count = static_cast<uint32_t>(sizeof(hasten_sdk_list) / sizeof(hasten_sdk_list[0]));  \
    return HASTEN_OK;                                                                       \
  }

#endif  // HASTEN_PLUGIN_HPP
