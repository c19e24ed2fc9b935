// The probe cache file: {"version": 1, "entries": [{host, file, size, mtime_ns, safe, reason}]}.
#include "plugins/probe_cache.hpp"

#include <hasten/plugin.h>
#include <hasten/version.hpp>

#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "plugins/host_api.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace hasten::detail {

namespace {

std::string cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg == '/') return (fs::path(xdg) / "hasten" / "plugin-probes.json").string();
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home == '/') return (fs::path(home) / ".cache" / "hasten" / "plugin-probes.json").string();
  return "";
}

struct FileStamp {
  bool ok = false;
  int64_t size = 0;
  int64_t mtime_ns = 0;
};

FileStamp stamp(const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return {};
  return {true, static_cast<int64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + static_cast<int64_t>(st.st_mtim.tv_nsec)};
}

// Files larger than this are not a cache this small program wrote: ignored.
constexpr std::uintmax_t kMaxCacheBytes = 16u << 20;
constexpr size_t kMaxEntries = 4096;

}  // namespace

ProbeCache::ProbeCache() : path_(cache_path()) {
  host_ = "abi " + std::to_string(HASTEN_ABI_MAJOR) + "." + std::to_string(HASTEN_ABI_MINOR) + "; hasten " +
          hasten::version() + "; torch " + host_torch_fingerprint();
  if (path_.empty()) return;
  std::error_code ec;
  const auto size = fs::file_size(path_, ec);
  if (ec || size > kMaxCacheBytes) return;
  std::ifstream in(path_, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const json doc = json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || doc.value("version", 0) != 1 || !doc.contains("entries") ||
      !doc["entries"].is_array()) {
    dirty_ = true;  // corrupt or foreign: rewritten at the next save
    return;
  }
  for (const auto& e : doc["entries"]) {
    if (!e.is_object() || !e.contains("host") || !e["host"].is_string() || !e.contains("file") ||
        !e["file"].is_string() || !e.contains("size") || !e["size"].is_number_integer() || !e.contains("mtime_ns") ||
        !e["mtime_ns"].is_number_integer() || !e.contains("safe") || !e["safe"].is_boolean() ||
        !e.contains("reason") || !e["reason"].is_string()) {
      dirty_ = true;
      continue;
    }
    if (entries_.size() >= kMaxEntries) break;
    entries_[e["host"].get<std::string>() + "\n" + e["file"].get<std::string>()] = e.dump();
  }
}

std::optional<ProbeVerdict> ProbeCache::find(const std::string& file) const {
  const auto it = entries_.find(host_ + "\n" + file);
  if (it == entries_.end()) return std::nullopt;
  const FileStamp now = stamp(file);
  const json e = json::parse(it->second);
  if (!now.ok || e["size"].get<int64_t>() != now.size || e["mtime_ns"].get<int64_t>() != now.mtime_ns)
    return std::nullopt;
  return ProbeVerdict{e["safe"].get<bool>(), e["reason"].get<std::string>()};
}

void ProbeCache::remember(const std::string& file, const ProbeVerdict& verdict) {
  const FileStamp now = stamp(file);
  if (!now.ok) return;
  const json e = {{"host", host_},       {"file", file},         {"size", now.size},
                  {"mtime_ns", now.mtime_ns}, {"safe", verdict.safe}, {"reason", verdict.reason}};
  entries_[host_ + "\n" + file] = e.dump();
  dirty_ = true;
}

void ProbeCache::save() {
  if (!dirty_ || path_.empty()) return;
  std::error_code ec;
  const fs::path target(path_);
  fs::create_directories(target.parent_path(), ec);
  if (ec) return;
  json doc = {{"version", 1}, {"entries", json::array()}};
  for (auto& [key, entry] : entries_) doc["entries"].push_back(json::parse(entry));
  // A private temporary name per process, renamed over the cache: readers see the old or the
  // new file, never half of one; concurrent starts (ranks) only lose each other's additions.
  const fs::path tmp = target.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;
    out << doc.dump(1) << "\n";
    out.flush();
    if (!out) {
      out.close();
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return;
  }
  dirty_ = false;
}

}  // namespace hasten::detail
