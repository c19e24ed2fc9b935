// Checkpoint files: per-rank file lists, the temporary directory and its rename into place, the
// manifest, verification, pruning (the durable writes themselves: formats/file_records.cpp).
#include "checkpoint/checkpoint_files.hpp"

#include <hasten/error.hpp>

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "formats/checksum.hpp"
#include "formats/file_records.hpp"
#include "util/test_hooks.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace hasten::detail {

namespace {


std::string crc_text(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

constexpr const char* kManifest = "manifest.json";
// Written first into every temporary directory a save makes: a later save removes a leftover
// temporary directory only when it carries it (never what someone else put at that name).
constexpr const char* kSavingMark = ".hasten-saving";


}  // namespace

void write_rank_files(const fs::path& tmp, int rank, const std::vector<FileRecord>& files) {
  json list = json::object();
  for (auto& f : files) {
    list[f.name] = {{"size", f.size}, {"crc32c", crc_text(f.crc32c)}};
    if (f.chunk_size > 0) {
      json chunks = json::array();
      for (uint32_t c : f.chunk_crc32c) chunks.push_back(crc_text(c));
      list[f.name]["chunk_size"] = f.chunk_size;
      list[f.name]["chunks"] = chunks;
    }
  }
  write_file(tmp, ".files." + std::to_string(rank) + ".json", list.dump());
}

fs::path saving_dir(const fs::path& final_dir) {
  return fs::path(parent_or_dot(final_dir)) / ("." + final_dir.filename().string() + ".saving");
}

fs::path set_aside_dir(const fs::path& final_dir) {
  return fs::path(parent_or_dot(final_dir)) / ("." + final_dir.filename().string() + ".replaced");
}

bool is_hasten_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_symlink(dir, ec) || !fs::is_directory(dir, ec)) return false;
  const fs::path manifest = dir / kManifest;
  if (fs::is_symlink(manifest, ec) || !fs::is_regular_file(manifest, ec)) return false;
  if (fs::file_size(manifest, ec) > kMaxManifestBytes) return false;
  try {
    const json m = json::parse(read_file(manifest), nullptr, false);
    return m.is_object() && m.contains("format") && m["format"] == "hasten-checkpoint";
  } catch (const std::exception&) {
    return false;
  }
}

std::string recover_checkpoint(const fs::path& final_dir) {
  std::error_code ec;
  const fs::path aside = set_aside_dir(final_dir);
  if (fs::exists(fs::symlink_status(final_dir, ec)) || !is_hasten_checkpoint(aside) || !verify_checkpoint(aside).empty())
    return "";
  fs::rename(aside, final_dir, ec);
  if (ec) return "";
  return "put back '" + final_dir.string() + "', which a save killed while replacing it had set aside as '" +
         aside.string() + "'";
}

fs::path prepare_save(const fs::path& final_dir, const std::string& owner) {
  std::error_code ec;
  const std::string name = final_dir.filename().string();
  if (name.empty() || name == "." || name == "..")
    throw Error("save_state: '" + final_dir.string() + "' does not name a directory to create");
  fs::create_directories(parent_or_dot(final_dir), ec);
  if (ec) throw Error("save_state: cannot create '" + parent_or_dot(final_dir) + "': " + ec.message());
  recover_checkpoint(final_dir);
  const auto target = fs::symlink_status(final_dir, ec);
  if (fs::exists(target) && !is_hasten_checkpoint(final_dir))
    throw Error("save_state: '" + final_dir.string() + "' exists and is not a hasten checkpoint (" +
                (fs::is_symlink(target) ? "a symbolic link"
                 : fs::is_directory(target) ? "no manifest.json of hasten's checkpoint format"
                                            : "not a directory") +
                "); it is left alone: choose another directory (a checkpoint directory is replaced as a whole)");
  // What an earlier save of this directory left: only what hasten made is removed.
  const fs::path tmp = saving_dir(final_dir), aside = set_aside_dir(final_dir);
  if (fs::exists(fs::symlink_status(tmp, ec))) {
    // Ours: marked, a complete checkpoint a swap left there, or empty (a save killed between
    // its mkdir and its mark; an empty directory holds nothing to lose).
    const bool empty = fs::is_directory(fs::symlink_status(tmp, ec)) && fs::is_empty(tmp, ec);
    if (fs::is_symlink(fs::symlink_status(tmp, ec)) ||
        (!fs::exists(tmp / kSavingMark, ec) && !is_hasten_checkpoint(tmp) && !empty))
      throw Error("save_state: '" + tmp.string() + "' exists and was not made by hasten's save_state (" + kSavingMark +
                  " is missing); it is left alone: remove it or choose another directory");
    fs::remove_all(tmp, ec);
    if (ec) throw Error("save_state: cannot remove the unfinished save '" + tmp.string() + "': " + ec.message());
  }
  if (fs::exists(fs::symlink_status(aside, ec))) {
    if (!is_hasten_checkpoint(aside))
      throw Error("save_state: '" + aside.string() + "' exists and is not a hasten checkpoint; it is left alone: "
                  "remove it or choose another directory");
    fs::remove_all(aside, ec);
    if (ec) throw Error("save_state: cannot remove the replaced checkpoint '" + aside.string() + "': " + ec.message());
  }
  // mkdir, not create_directories: a directory that appeared meanwhile is not taken over.
  if (::mkdir(tmp.c_str(), 0755) != 0) file_error("create the directory", tmp);
  write_file(tmp, kSavingMark, "hasten save_state " + owner + "\n");
  return tmp;
}

std::string saving_owner(const fs::path& tmp) {
  std::error_code ec;
  const fs::path mark = tmp / kSavingMark;
  if (fs::is_symlink(fs::symlink_status(mark, ec)) || !fs::is_regular_file(mark, ec) || fs::file_size(mark, ec) > 4096)
    return "";
  try {
    std::string text = read_file(mark);
    const std::string head = "hasten save_state ";
    if (text.rfind(head, 0) != 0 || text.empty() || text.back() != '\n') return "";
    return text.substr(head.size(), text.size() - head.size() - 1);
  } catch (const std::exception&) {
    return "";
  }
}

namespace {

// Swaps two directory entries atomically; false (errno set) where the file system cannot.
bool exchange(const fs::path& a, const fs::path& b) {
  if (test_forbids("RENAME_EXCHANGE")) {
    errno = EINVAL;
    return false;
  }
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
}

}  // namespace

void finalize_checkpoint(const fs::path& tmp, const fs::path& final_dir, int world_size, json meta,
                         const std::vector<int>& ranks) {
  std::vector<int> merged = ranks;
  if (merged.empty())
    for (int r = 0; r < world_size; ++r) merged.push_back(r);
  json files = json::object();
  for (int r : merged) {
    const fs::path part = tmp / (".files." + std::to_string(r) + ".json");
    std::error_code ec;
    if (!fs::exists(part, ec))
      throw Error("checkpoint: rank " + std::to_string(r) + " did not record its files in '" + tmp.string() + "'");
    json list = json::parse(read_file(part), nullptr, false);
    if (!list.is_object()) throw Error("checkpoint: '" + part.string() + "' is malformed");
    for (auto it = list.begin(); it != list.end(); ++it) {
      if (files.contains(it.key()))
        throw Error("checkpoint: two ranks wrote '" + it.key() + "' in '" + tmp.string() + "'");
      files[it.key()] = it.value();
    }
    fs::remove(part, ec);
  }
  meta["format"] = "hasten-checkpoint";
  meta["version"] = 1;
  meta["world_size"] = world_size;
  if (static_cast<int>(merged.size()) != world_size) meta["ranks"] = merged;  // one machine's copy
  meta["files"] = files;
  meta["complete"] = true;
  test_point("save-files-written", 0);
  write_file(tmp, kManifest, meta.dump(1));
  {
    std::error_code ec;
    fs::remove(tmp / kSavingMark, ec);  // complete: a checkpoint now, not an unfinished save
  }
  fsync_path(tmp, true);
  test_point("save-manifest-written", 0);
  const std::string parent = parent_or_dot(final_dir);
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(final_dir, ec))) {
    // RENAME_NOREPLACE: something that appeared at final_dir meanwhile is not replaced.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE) != 0 &&
        (errno != EINVAL || ::rename(tmp.c_str(), final_dir.c_str()) != 0))
      file_error("rename '" + tmp.string() + "' to", final_dir);
    fsync_path(parent, true);
    return;
  }
  if (exchange(tmp, final_dir)) {
    // final_dir is the new checkpoint; tmp holds the old one.
    fsync_path(parent, true);
    test_point("save-swapped", 0);
    fs::remove_all(tmp, ec);
    return;
  }
  // No atomic swap here (an older kernel, a file system without it): set the old one aside,
  // rename, remove the old one; put it back on a failure.
  const fs::path aside = set_aside_dir(final_dir);
  fs::rename(final_dir, aside, ec);
  if (ec) throw Error("checkpoint: cannot set '" + final_dir.string() + "' aside: " + ec.message());
  try {
    test_point("save-set-aside", 0);
    fs::rename(tmp, final_dir, ec);
    if (ec) throw Error("checkpoint: cannot rename '" + tmp.string() + "' to '" + final_dir.string() + "': " + ec.message());
    fsync_path(parent, true);
  } catch (...) {
    std::error_code back;
    fs::rename(aside, final_dir, back);
    throw;
  }
  test_point("save-swapped", 0);
  fs::remove_all(aside, ec);
}

json read_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifest;
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw Error("checkpoint '" + dir.string() + "' does not exist");
  if (!fs::is_directory(dir, ec)) throw Error("checkpoint '" + dir.string() + "' is not a directory");
  if (!fs::exists(path, ec))
    throw Error("checkpoint '" + dir.string() + "' has no manifest.json (it is incomplete: its save did not finish)");
  if (fs::file_size(path, ec) > kMaxManifestBytes)
    throw Error("checkpoint '" + dir.string() + "': manifest.json has more than " + std::to_string(kMaxManifestBytes >> 20) +
                " MiB (not a manifest hasten wrote)");
  json m = json::parse(read_file(path), nullptr, false);
  if (!m.is_object() || m.value("format", "") != "hasten-checkpoint" || !m.contains("files") || !m["files"].is_object())
    throw Error("checkpoint '" + dir.string() + "': manifest.json is malformed");
  if (!m.contains("complete") || m["complete"] != true)
    throw Error("checkpoint '" + dir.string() + "': manifest.json does not mark it complete");
  if (m.contains("ranks")) {  // save_on_each_node: one machine's copy
    const json& r = m["ranks"];
    const int64_t world = m.value("world_size", json(0)).is_number_integer() ? m["world_size"].get<int64_t>() : 0;
    bool ok = r.is_array() && !r.empty();
    int64_t last = -1;
    for (const json& v : ok ? r : json::array()) {
      ok = ok && v.is_number_integer() && v.get<int64_t>() > last && v.get<int64_t>() < world;
      if (ok) last = v.get<int64_t>();
    }
    if (!ok)
      throw Error("checkpoint '" + dir.string() + "': manifest.json is malformed: 'ranks' must list ranks below its "
                  "world_size, ascending");
  }
  // Every size a reader will trust is checked here, once: the files' sizes (compared with the
  // files themselves later), their checksums, and the chunk layout of ranged files.
  auto malformed = [&](const std::string& name, const std::string& why) {
    return Error("checkpoint '" + dir.string() + "': manifest.json is malformed: file '" + name + "' " + why);
  };
  for (auto it = m["files"].begin(); it != m["files"].end(); ++it) {
    const std::string& name = it.key();
    const json& f = it.value();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      throw malformed(name, "is not a plain file name");
    auto hex8 = [](const json& v) {
      if (!v.is_string() || v.get<std::string>().size() != 8) return false;
      const std::string t = v.get<std::string>();
      return std::all_of(t.begin(), t.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
    };
    if (!f.is_object() || !f.contains("size") || !f["size"].is_number_unsigned() || !f.contains("crc32c") ||
        !hex8(f["crc32c"]))
      throw malformed(name, "needs an unsigned size and an 8-digit crc32c");
    if (f["size"].get<uint64_t>() > kMaxFileSize) throw malformed(name, "claims more than 2^50 bytes");
    if (f.contains("chunk_size") || f.contains("chunks")) {
      if (!f.contains("chunk_size") || !f["chunk_size"].is_number_unsigned() || !f.contains("chunks") ||
          !f["chunks"].is_array())
        throw malformed(name, "needs both an unsigned chunk_size and a chunks array");
      const uint64_t chunk = f["chunk_size"].get<uint64_t>(), size = f["size"].get<uint64_t>();
      if (chunk == 0 || chunk > kMaxChunkSize)
        throw malformed(name, "has chunk_size " + std::to_string(chunk) + " (allowed: 1 to " + std::to_string(kMaxChunkSize) + ")");
      const uint64_t count = size / chunk + (size % chunk != 0 ? 1 : 0);  // no overflow: both bounded
      if (f["chunks"].size() != count)
        throw malformed(name, "lists " + std::to_string(f["chunks"].size()) + " chunk checksums for " + std::to_string(size) +
                                  " bytes in chunks of " + std::to_string(chunk) + " (" + std::to_string(count) + " expected)");
      for (const json& c : f["chunks"])
        if (!hex8(c)) throw malformed(name, "has a chunk checksum that is not 8 hex digits");
    }
  }
  return m;
}

std::string verify_checkpoint(const fs::path& dir) {
  json m;
  try {
    m = read_manifest(dir);
  } catch (const Error& e) {
    return e.what();
  }
  for (auto it = m["files"].begin(); it != m["files"].end(); ++it) {
    const fs::path path = dir / it.key();
    std::error_code ec;
    const uint64_t want = it.value().value("size", uint64_t{0});
    if (!fs::exists(path, ec)) return "checkpoint file '" + path.string() + "' is missing";
    if (!fs::is_regular_file(path, ec)) return "checkpoint file '" + path.string() + "' is not a regular file";
    const uint64_t got = fs::file_size(path, ec);
    if (ec || got != want)
      return "checkpoint file '" + path.string() + "' has " + std::to_string(got) + " bytes, the manifest says " +
             std::to_string(want) + " (truncated or replaced)";
  }
  return "";
}

std::vector<std::pair<int, fs::path>> numbered_checkpoints(const fs::path& checkpoints) {
  std::vector<std::pair<int, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(checkpoints, ec)) return out;
  for (auto& e : fs::directory_iterator(checkpoints, ec)) {
    const std::string name = e.path().filename().string();
    const std::string prefix = "checkpoint_";
    if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) continue;
    const std::string digits = name.substr(prefix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) || digits.size() > 9)
      continue;
    out.emplace_back(std::stoi(digits), e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> prune_checkpoints(const fs::path& checkpoints, int keep) {
  std::vector<std::string> failed;
  std::vector<fs::path> complete;
  for (auto& [n, path] : numbered_checkpoints(checkpoints))
    if (verify_checkpoint(path).empty()) complete.push_back(path);
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < complete.size(); ++i) {
    std::error_code ec;
    fs::remove_all(complete[i], ec);
    if (ec) failed.push_back(complete[i].string() + ": " + ec.message());
  }
  return failed;
}

}  // namespace hasten::detail
