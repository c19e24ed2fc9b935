// Loading one plugin library: its files checked (permissions, ELF), probed in a child process,
// then opened with Boost.DLL and every descriptor validated against ABI v1 (registry.cpp
// decides what to load and keeps what loaded).
#define BOOST_DLL_USE_STD_FS 1
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/registry.hpp>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include "plugins/abi_array.hpp"
#include "plugins/elf_check.hpp"
#include "plugins/host_api.hpp"
#include "plugins/loaded_plugin.hpp"
#include "plugins/plugin_description.hpp"
#include "plugins/plugin_probe.hpp"
#include "plugins/probe_cache.hpp"
#include "util/text_util.hpp"

#include "plugins/plugin_loading.hpp"

namespace fs = std::filesystem;

namespace hasten::detail {

namespace {

// The smallest vtable each kind may declare (ABI 1.0) and the slots it must fill.
struct KindRules {
  size_t min_vtable_size;
  std::vector<std::pair<const char*, size_t>> required;  // slot name, offset
};

#define HASTEN_SLOT(type, slot) \
  { #slot, offsetof(type, slot) }

const KindRules& rules_for(PluginKind kind) {
  static const KindRules strategy{
      offsetof(hasten_strategy_vtable, clip_grad_norm) + sizeof(void*),
      {HASTEN_SLOT(hasten_strategy_vtable, create), HASTEN_SLOT(hasten_strategy_vtable, destroy),
       HASTEN_SLOT(hasten_strategy_vtable, prepare_model)}};
  static const KindRules precision{
      offsetof(hasten_precision_vtable, loss_scale) + sizeof(void*),
      {HASTEN_SLOT(hasten_precision_vtable, create),
       HASTEN_SLOT(hasten_precision_vtable, destroy)}};
  static const KindRules tracker{
      offsetof(hasten_tracker_vtable, finish) + sizeof(void*),
      {HASTEN_SLOT(hasten_tracker_vtable, create), HASTEN_SLOT(hasten_tracker_vtable, destroy),
       HASTEN_SLOT(hasten_tracker_vtable, start), HASTEN_SLOT(hasten_tracker_vtable, log_scalars)}};
  static const KindRules comm{
      offsetof(hasten_comm_vtable, abort) + sizeof(void*),
      {HASTEN_SLOT(hasten_comm_vtable, create), HASTEN_SLOT(hasten_comm_vtable, destroy),
       HASTEN_SLOT(hasten_comm_vtable, init), HASTEN_SLOT(hasten_comm_vtable, supports_device),
       HASTEN_SLOT(hasten_comm_vtable, allreduce), HASTEN_SLOT(hasten_comm_vtable, allgather),
       HASTEN_SLOT(hasten_comm_vtable, broadcast), HASTEN_SLOT(hasten_comm_vtable, barrier),
       HASTEN_SLOT(hasten_comm_vtable, work_wait), HASTEN_SLOT(hasten_comm_vtable, work_free)}};
  switch (kind) {
    case PluginKind::Strategy: return strategy;
    case PluginKind::Precision: return precision;
    case PluginKind::Tracker: return tracker;
    case PluginKind::Comm: break;
  }
  return comm;
}
#undef HASTEN_SLOT

bool valid_kind(int32_t kind) { return kind >= 1 && kind <= 4; }

bool valid_name(const char* name) {
  if (name == nullptr || *name == '\0' || std::strlen(name) > 64) return false;
  for (const char* p = name; *p; ++p) {
    const char c = *p;
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  }
  return true;
}

std::string str_or_empty(const char* s) { return s != nullptr ? s : ""; }

std::string version_string(uint32_t v) {
  return std::to_string(HASTEN_ABI_VERSION_MAJOR(v)) + "." +
         std::to_string(HASTEN_ABI_VERSION_MINOR(v));
}

// Holds every library ever loaded, forever: descriptors and vtables point into them, and
// unloading a library whose code may still be referenced is how hosts crash at exit.
std::deque<boost::dll::shared_library>& library_keeper() {
  static auto* libs = new std::deque<boost::dll::shared_library>();
  return *libs;
}

using Mark = std::function<void(detail::ProbeStage)>;

// Validates one descriptor; on success returns the plugin, else adds a refusal.
std::unique_ptr<LoadedPlugin> validate_descriptor(const hasten_plugin_descriptor* raw,
                                                  uint32_t index, const std::string& file,
                                                  std::vector<PluginRefusal>& refusals) {
  auto refuse = [&](const std::string& plugin, const std::string& reason) {
    refusals.push_back({file, plugin, reason});
    return nullptr;
  };
  const std::string at = "descriptor " + std::to_string(index);
  if (raw == nullptr) return refuse("", at + " is NULL");
  constexpr size_t min_size = offsetof(hasten_plugin_descriptor, vtable) + sizeof(void*);
  if (raw->struct_size < min_size)
    return refuse("", at + " declares struct_size " + std::to_string(raw->struct_size) +
                          ", smaller than ABI 1.0's " + std::to_string(min_size));
  if (HASTEN_ABI_VERSION_MAJOR(raw->abi_version) != HASTEN_ABI_MAJOR)
    return refuse("", at + " was built for plugin ABI " + version_string(raw->abi_version) +
                          "; this hasten speaks ABI " + version_string(HASTEN_ABI_VERSION));
  hasten_plugin_descriptor d{};
  std::memcpy(&d, raw, std::min<size_t>(raw->struct_size, sizeof(d)));

  if (!valid_kind(d.kind))
    return refuse("", at + " has unknown kind " + std::to_string(d.kind) +
                          " (allowed: 1 strategy, 2 precision, 3 tracker, 4 comm)");
  const auto kind = static_cast<PluginKind>(d.kind);
  if (!valid_name(d.name))
    return refuse(std::string(to_string(kind)) + "/?",
                  at + " has an invalid name '" + untrusted_text(d.name) +
                      "' (allowed: 1-64 characters of a-z, 0-9, '_' and '-')");
  const std::string label = std::string(to_string(kind)) + "/" + d.name;

  const bool torch_kind = kind == PluginKind::Strategy || kind == PluginKind::Precision;
  const std::string fingerprint = str_or_empty(d.torch_fingerprint);
  if (torch_kind && fingerprint.empty())
    return refuse(label, std::string(to_string(kind)) +
                             " plugins are torch tier and must declare the LibTorch build they "
                             "were compiled against (torch_fingerprint is NULL)");
  if (!fingerprint.empty() && fingerprint != detail::host_torch_fingerprint())
    return refuse(label, "built against LibTorch '" + untrusted_text(fingerprint.c_str(), 256) +
                             "', but this hasten was built against '" +
                             detail::host_torch_fingerprint() + "'; rebuild the plugin");

  if (d.vtable == nullptr) return refuse(label, "vtable is NULL");
  const auto* header = static_cast<const uint32_t*>(d.vtable);  // {struct_size, abi_version}
  const KindRules& rules = rules_for(kind);
  if (header[0] < rules.min_vtable_size)
    return refuse(label, std::string(to_string(kind)) + " vtable declares struct_size " +
                             std::to_string(header[0]) + ", smaller than ABI 1.0's " +
                             std::to_string(rules.min_vtable_size));
  if (HASTEN_ABI_VERSION_MAJOR(header[1]) != HASTEN_ABI_MAJOR)
    return refuse(label, "vtable was built for plugin ABI " + version_string(header[1]) +
                             "; this hasten speaks ABI " + version_string(HASTEN_ABI_VERSION));

  auto plugin = std::make_unique<LoadedPlugin>();
  std::memcpy(&plugin->vt, d.vtable, std::min<size_t>(header[0], sizeof(plugin->vt)));
  // The copy may be larger than the kind's struct (union); clear what is past it.
  size_t kind_size = 0;
  switch (kind) {
    case PluginKind::Strategy: kind_size = sizeof(hasten_strategy_vtable); break;
    case PluginKind::Precision: kind_size = sizeof(hasten_precision_vtable); break;
    case PluginKind::Tracker: kind_size = sizeof(hasten_tracker_vtable); break;
    case PluginKind::Comm: kind_size = sizeof(hasten_comm_vtable); break;
  }
  const size_t copied = std::min<size_t>(header[0], kind_size);
  std::memset(reinterpret_cast<char*>(&plugin->vt) + copied, 0, sizeof(plugin->vt) - copied);
  for (const auto& [slot, offset] : rules.required) {
    void* fn = nullptr;
    std::memcpy(&fn, reinterpret_cast<const char*>(&plugin->vt) + offset, sizeof(fn));
    if (fn == nullptr) return refuse(label, std::string("required slot '") + slot + "' is NULL");
  }
  // A precision that saves state must load it too (ABI 1.7): a resumed run would otherwise
  // silently start its scaler afresh.
  if (kind == PluginKind::Precision && (plugin->vt.precision.state_dict == nullptr) !=
                                           (plugin->vt.precision.load_state_dict == nullptr))
    return refuse(label, "slots 'state_dict' and 'load_state_dict' come together, and one of them is NULL");

  PluginInfo& info = plugin->info;
  info.kind = kind;
  info.name = d.name;
  info.version = str_or_empty(d.version);
  info.description = str_or_empty(d.description);
  info.abi_major = HASTEN_ABI_VERSION_MAJOR(d.abi_version);
  info.abi_minor = HASTEN_ABI_VERSION_MINOR(d.abi_version);
  info.tier = fingerprint.empty() ? "c" : "torch";
  info.torch_fingerprint = fingerprint;
  info.file = file;
  if (kind == PluginKind::Comm && plugin->vt.comm.serves != nullptr) {
    const hasten_comm_serves* sv = plugin->vt.comm.serves;
    if (sv->struct_size < offsetof(hasten_comm_serves, priority) + sizeof(int32_t))
      return refuse(label, "serves declares a too small struct_size " + std::to_string(sv->struct_size));
    if (sv->n_device_types > 0 && sv->device_types == nullptr)
      return refuse(label, "serves declares " + std::to_string(sv->n_device_types) + " device types but device_types is NULL");
    if (sv->scope != HASTEN_COMM_SCOPE_ONE_MACHINE && sv->scope != HASTEN_COMM_SCOPE_ANY)
      return refuse(label, "serves has unknown scope " + std::to_string(sv->scope) + " (allowed: 1 one machine, 2 any machines)");
    info.serves_declared = true;
    for (uint32_t i = 0; i < sv->n_device_types; ++i) info.serves_device_types.push_back(sv->device_types[i]);
    info.serves_any_machines = sv->scope == HASTEN_COMM_SCOPE_ANY;
    info.serves_priority = sv->priority;
  }
  if (const std::string why = detail::read_description(d, kind, info); !why.empty()) return refuse(label, why);
  if (d.n_presets > 0 && d.presets == nullptr)
    return refuse(label, "declares " + std::to_string(d.n_presets) + " presets but presets is NULL");
  for (uint32_t i = 0; i < d.n_presets; ++i) {
    hasten_preset p{};
    if (std::string why; !detail::abi_element(d.presets, i, &p, &why)) return refuse(label, "presets: " + why);
    if (p.struct_size < offsetof(hasten_preset, options_json) + sizeof(void*))
      return refuse(label, "preset " + std::to_string(i) + " has a too small struct_size");
    if (!valid_name(p.name))
      return refuse(label, "preset " + std::to_string(i) + " has an invalid name '" + untrusted_text(p.name) + "'");
    const std::string options = p.options_json ? p.options_json : "{}";
    auto parsed = nlohmann::json::parse(options, nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object())
      return refuse(label, "preset '" + std::string(p.name) +
                               "' options_json is not a JSON object: " + options);
    info.presets.push_back({p.name, str_or_empty(p.description), options});
  }
  return plugin;
}

// The optional readers of strategies' own config file formats (plugin_config_file.h): each is
// checked and attached to the strategy it names; a bad one is refused on its own (the
// strategy stays usable with its YAML section).
void attach_config_file_readers(boost::dll::shared_library& lib, const std::string& file, LoadOutcome& out) {
  if (!lib.has(HASTEN_CONFIG_FILE_READERS_V1_SYMBOL)) return;
  auto readers = lib.get<std::remove_pointer_t<hasten_config_file_readers_v1_fn>>(HASTEN_CONFIG_FILE_READERS_V1_SYMBOL);
  const hasten_config_file_reader* const* list = nullptr;
  uint32_t count = 0;
  detail::clear_plugin_error();
  hasten_status status = HASTEN_ERR_INTERNAL;
  try {
    status = readers(detail::registry_host(), HASTEN_ABI_VERSION, &list, &count);
  } catch (...) {
    out.refusals.push_back({file, "", "config file readers: the call threw an exception"});
    return;
  }
  if (status != HASTEN_OK || (count > 0 && list == nullptr) || count > 64) {
    out.refusals.push_back({file, "", std::string("config file readers: ") +
                                          (status != HASTEN_OK ? detail::status_name(status) + std::string(": ") +
                                                                     detail::take_plugin_error()
                                                               : "a bad list")});
    return;
  }
  for (uint32_t i = 0; i < count; ++i) {
    const hasten_config_file_reader* r = list[i];
    hasten_config_file_reader copy{};
    std::string why;
    if (r == nullptr || r->struct_size < offsetof(hasten_config_file_reader, read) + sizeof(void*)) {
      why = "NULL or too short";
    } else {
      std::memcpy(&copy, r, std::min<size_t>(r->struct_size, sizeof(copy)));
      if (copy.read == nullptr || copy.strategy == nullptr || copy.format == nullptr || copy.format[0] == '\0')
        why = "has no read slot, strategy or format";
    }
    LoadedPlugin* owner = nullptr;
    if (why.empty()) {
      for (auto& p : out.plugins)
        if (p->info.kind == PluginKind::Strategy && p->info.name == copy.strategy) owner = p.get();
      if (owner == nullptr) why = std::string("names '") + copy.strategy + "', not a strategy of this library";
      else if (owner->config_file_reader.read != nullptr) why = std::string("a second reader for '") + copy.strategy + "'";
      else if (copy.section_key != nullptr && owner->info.config_section.empty())
        why = "has a section_key but the strategy owns no config section";
    }
    if (!why.empty()) {
      out.refusals.push_back({file, "", "config file reader " + std::to_string(i) + ": " + why});
      continue;
    }
    owner->config_file_reader = copy;
  }
}


// Loads a library and validates everything it declares, calling mark() before each step (the
// probe child reports them). Never throws. Only for files the probe found safe.
LoadOutcome load_library_in_process(const std::string& file, const Mark& mark) {
  LoadOutcome out;
  auto refuse = [&](const std::string& reason) {
    out.refusals.push_back({file, "", reason});
    return std::move(out);
  };
  mark(detail::ProbeStage::Loading);
  boost::dll::shared_library lib;
  try {
    lib.load(file, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    // Boost wraps dlerror()'s text; the loader's own words are the useful part.
    std::string why = e.what();
    const std::string tag = "(dlerror system message: ";
    if (const auto at = why.find(tag); at != std::string::npos) {
      why = why.substr(at + tag.size());
      if (const auto end = why.rfind("): "); end != std::string::npos) why = why.substr(0, end);
    }
    // The loader quotes names from the file; a damaged one must not break the line or the
    // terminal.
    return refuse("not a loadable library: " + untrusted_text(why.c_str(), why.size()));
  }
  if (!lib.has(HASTEN_PLUGIN_ENTRY_V1_SYMBOL)) {
    for (int major = 9; major >= 2; --major) {
      if (lib.has("hasten_plugin_entry_v" + std::to_string(major))) {
        library_keeper().push_back(std::move(lib));
        return refuse("built for plugin ABI major " + std::to_string(major) +
                      " only (it exports hasten_plugin_entry_v" + std::to_string(major) +
                      "); this hasten speaks ABI major " + std::to_string(HASTEN_ABI_MAJOR));
      }
    }
    library_keeper().push_back(std::move(lib));
    return refuse(std::string("missing entry symbol ") + HASTEN_PLUGIN_ENTRY_V1_SYMBOL +
                  " (not a hasten plugin)");
  }
  auto entry = lib.get<std::remove_pointer_t<hasten_plugin_entry_v1_fn>>(
      HASTEN_PLUGIN_ENTRY_V1_SYMBOL);
  library_keeper().push_back(lib);

  const hasten_plugin_descriptor* const* list = nullptr;
  uint32_t count = 0;
  detail::clear_plugin_error();
  hasten_status status = HASTEN_ERR_INTERNAL;
  mark(detail::ProbeStage::Entry);
  try {
    status = entry(detail::registry_host(), HASTEN_ABI_VERSION, &list, &count);
  } catch (const std::exception& e) {
    return refuse(std::string("entry point threw an exception: ") + e.what());
  } catch (...) {
    return refuse("entry point threw an exception");
  }
  if (status != HASTEN_OK)
    return refuse(std::string("entry point failed (") + detail::status_name(status) +
                  "): " + detail::take_plugin_error());
  if (count == 0) return refuse("entry point declared no plugins");
  if (list == nullptr) return refuse("entry point returned a NULL descriptor list");
  if (count > 1024) return refuse("entry point declared " + std::to_string(count) + " plugins");
  mark(detail::ProbeStage::Descriptors);

  std::set<std::pair<PluginKind, std::string>> seen;
  for (uint32_t i = 0; i < count; ++i) {
    auto plugin = validate_descriptor(list[i], i, file, out.refusals);
    if (!plugin) continue;
    const auto key = std::make_pair(plugin->info.kind, plugin->info.name);
    if (!seen.insert(key).second) {
      out.refusals.push_back({file, std::string(to_string(key.first)) + "/" + key.second,
                              "duplicate name: the library declares it twice"});
      continue;
    }
    out.plugins.push_back(std::move(plugin));
  }
  attach_config_file_readers(lib, file, out);
  return out;
}

// Whether `file` can be loaded in this process without taking it down: its ELF headers are
// checked here, then (unless `cache` remembers this very file) a child process loads it, runs
// its entry function and reads its descriptors within the probe time limit. Returns why not,
// or "".
std::string probe_file(const std::string& file, detail::ProbeCache* cache) {
  if (std::string why = detail::elf_problem(file); !why.empty()) return "not a loadable library: " + why;
  if (cache != nullptr) {
    if (auto verdict = cache->find(file)) {
      get_logger()->debug("plugin file {}: probe result from the cache ({})", file,
                          verdict->safe ? "loads" : verdict->reason);
      return verdict->safe ? "" : verdict->reason;
    }
  }
  const double timeout_s = detail::probe_timeout_s();
  get_logger()->debug("probing plugin file {} in a child process", file);
  const detail::ProbeOutcome probe =
      detail::probe_in_child(timeout_s, [&](const Mark& mark) {
        // The child also unloads what it loaded, so that destructors (fini_array) that would
        // crash this process at exit crash the child instead.
        const size_t before = library_keeper().size();
        load_library_in_process(file, mark);
        mark(detail::ProbeStage::Unloading);
        while (library_keeper().size() > before) library_keeper().pop_back();
      });
  if (cache != nullptr && !probe.timed_out) cache->remember(file, {probe.finished, probe.reason});
  return probe.finished ? "" : probe.reason;
}

}  // namespace


// Probes a library, then loads it here if that is safe. Never throws but for a bad
// HASTEN_PLUGIN_PROBE_TIMEOUT_S.
// Loading a library runs its code: one that anyone on the machine may replace, or that sits
// in a directory where anyone may replace it (a sticky directory such as /tmp excepted: there
// only its owner can), is refused. "" when file and its directory are safe.
std::string unsafe_permissions(const std::string& file) {
  struct stat st {};
  char mode[8];
  // stat follows a link: the library's own mode; the directory below is the one named.
  if (::stat(file.c_str(), &st) == 0 && (st.st_mode & S_IWOTH) != 0) {
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::string("world-writable (mode ") + mode + "): anyone on this machine could replace its code; `chmod o-w` it";
  }
  const std::string dir = fs::path(file).parent_path().empty() ? "." : fs::path(file).parent_path().string();
  if (::stat(dir.c_str(), &st) == 0 && (st.st_mode & S_IWOTH) != 0 && (st.st_mode & S_ISVTX) == 0) {
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return "in the world-writable directory '" + dir + "' (mode " + mode +
           "): anyone on this machine could replace it; `chmod o-w` the directory";
  }
  return "";
}

LoadOutcome load_library(const std::string& file, detail::ProbeCache* cache) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return {{}, {{file, "", "no such file"}}, false};
  if (!fs::is_regular_file(file, ec)) return {{}, {{file, "", "not a regular file"}}, false};
  if (const std::string why = unsafe_permissions(file); !why.empty()) return {{}, {{file, "", why}}, false};
  if (const std::string why = probe_file(file, cache); !why.empty()) return {{}, {{file, "", why}}, true};
  return load_library_in_process(file, [](detail::ProbeStage) {});
}

std::string canonical_or_same(const std::string& path) {
  std::error_code ec;
  auto c = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? path : c.string();
}

std::vector<std::string> split_path_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(':', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace hasten::detail
