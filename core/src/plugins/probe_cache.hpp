// What earlier probes of plugin files found, so that a start does not fork a probe for every
// file every time. Keyed by the file's path, size and modification time and by the host (ABI
// version, LibTorch fingerprint, hasten version): a changed file or another hasten probes again.
// Kept in $XDG_CACHE_HOME/hasten/plugin-probes.json (else ~/.cache/hasten/...), written
// atomically; a corrupt cache is ignored and rewritten, an unwritable one only costs speed.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace hasten::detail {

struct ProbeVerdict {
  bool safe = false;   // loaded, ran its entry and had its descriptors read in a child
  std::string reason;  // why not, when not safe
};

class ProbeCache {
 public:
  // Reads the cache file (once); a missing or unreadable one is an empty cache.
  ProbeCache();
  // The remembered verdict for `file` as it is now on disk, if any.
  std::optional<ProbeVerdict> find(const std::string& file) const;
  void remember(const std::string& file, const ProbeVerdict& verdict);
  // Writes the cache if anything changed; failures are ignored (the cache is an optimisation).
  void save();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string host_;
  std::map<std::string, std::string> entries_;  // "host\npath" -> JSON of the entry
  bool dirty_ = false;
};

}  // namespace hasten::detail
