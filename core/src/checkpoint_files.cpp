// Checkpoint files: durable writes, per-rank file lists, the manifest, verification, pruning.
#include "checkpoint_files.hpp"

#include <hasten/error.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "checksum.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace hasten::detail {

namespace {

[[noreturn]] void io_error(const std::string& what, const fs::path& path) {
  throw Error("checkpoint: cannot " + what + " '" + path.string() + "': " + std::strerror(errno));
}

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) io_error("open", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && !directory) io_error("flush", path);
}

std::string crc_text(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

constexpr const char* kManifest = "manifest.json";

}  // namespace

FileRecord write_file(const fs::path& dir, const std::string& name, const std::function<void(const ByteSink&)>& produce,
                      uint64_t chunk_size) {
  const fs::path path = dir / name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_error("create", path);
  FileRecord rec{name, 0, 0, chunk_size, {}};
  try {
    produce([&](const void* data, size_t size) {
      const auto* p = static_cast<const char*>(data);
      rec.crc32c = crc32c_update(rec.crc32c, p, size);
      for (size_t done = 0; chunk_size > 0 && done < size;) {
        const uint64_t at = rec.size + done;  // a new chunk begins at every multiple of chunk_size
        if (at % chunk_size == 0) rec.chunk_crc32c.push_back(0);
        const size_t n = static_cast<size_t>(std::min<uint64_t>(size - done, chunk_size - at % chunk_size));
        rec.chunk_crc32c.back() = crc32c_update(rec.chunk_crc32c.back(), p + done, n);
        done += n;
      }
      rec.size += size;
      while (size > 0) {
        const ssize_t n = ::write(fd, p, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) io_error("write", path);
        p += n;
        size -= static_cast<size_t>(n);
      }
    });
    if (::fsync(fd) != 0) io_error("flush", path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) io_error("close", path);
  return rec;
}

FileRecord write_file(const fs::path& dir, const std::string& name, const std::string& bytes) {
  return write_file(dir, name, [&](const ByteSink& sink) { sink(bytes.data(), bytes.size()); });
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("checkpoint: cannot read '" + path.string() + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

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

void finalize_checkpoint(const fs::path& tmp, const fs::path& final_dir, int world_size, json meta) {
  json files = json::object();
  for (int r = 0; r < world_size; ++r) {
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
  meta["files"] = files;
  meta["complete"] = true;
  write_file(tmp, kManifest, meta.dump(1));
  fsync_path(tmp, true);
  std::error_code ec;
  fs::rename(tmp, final_dir, ec);
  if (ec) throw Error("checkpoint: cannot rename '" + tmp.string() + "' to '" + final_dir.string() + "': " + ec.message());
  fsync_path(final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path(), true);
}

json read_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifest;
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw Error("checkpoint '" + dir.string() + "' does not exist");
  if (!fs::is_directory(dir, ec)) throw Error("checkpoint '" + dir.string() + "' is not a directory");
  if (!fs::exists(path, ec))
    throw Error("checkpoint '" + dir.string() + "' has no manifest.json (it is incomplete: its save did not finish)");
  json m = json::parse(read_file(path), nullptr, false);
  if (!m.is_object() || m.value("format", "") != "hasten-checkpoint" || !m.contains("files") || !m["files"].is_object())
    throw Error("checkpoint '" + dir.string() + "': manifest.json is malformed");
  if (!m.value("complete", false)) throw Error("checkpoint '" + dir.string() + "': manifest.json does not mark it complete");
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
