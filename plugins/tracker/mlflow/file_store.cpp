#include "file_store.hpp"

#include <hasten/plugin.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <system_error>

namespace fs = std::filesystem;

namespace hasten::mlflow {

namespace {

using hasten::sdk::Error;

[[noreturn]] void fail(const std::string& what, const fs::path& path, const std::string& why) {
  throw Error(HASTEN_ERR_SYSTEM, "mlflow: cannot " + what + " " + path.string() + ": " + why);
}

void make_dirs(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("create directory", dir, ec.message());
}

// YAML single-quoted scalar: every string is quoted, so PyYAML never reads an id such as
// '0' as an int or 'yes' as a bool.
std::string yaml_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("''") : std::string(1, c);
  return out + "'";
}

// meta.yaml replaced atomically (temporary file + rename), as MLflow's overwrite_yaml does,
// so a reader never sees half a file.
void write_yaml(const fs::path& file, const std::string& text) {
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) fail("write", tmp, std::strerror(errno));
    out << text;
    out.flush();
    if (!out) fail("write", tmp, std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) fail("write", file, ec.message());
}

std::string file_uri(const fs::path& p) { return "file://" + p.string(); }

std::string random_hex(size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) out += digits[rng() & 15];
  return out;
}

// The unquoted value of `key: value` in a meta.yaml written by MLflow (PyYAML) or by us.
std::string yaml_value(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::string v = line.substr(key.size() + 1);
    v.erase(0, v.find_first_not_of(' '));
    if (v.size() >= 2 && (v.front() == '\'' || v.front() == '"') && v.back() == v.front()) {
      const char q = v.front();
      v = v.substr(1, v.size() - 2);
      if (q == '\'')
        for (size_t at = 0; (at = v.find("''", at)) != std::string::npos; ++at) v.erase(at, 1);
    }
    return v;
  }
  return "";
}

std::string read_file(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string experiment_yaml(const fs::path& root, const std::string& id, const std::string& name, int64_t t) {
  // The keys of MLflow's Experiment in sorted order, as write_yaml(sort_keys=True) has them.
  return "artifact_location: " + yaml_quoted(file_uri(root / id)) + "\ncreation_time: " + std::to_string(t) +
         "\nexperiment_id: " + yaml_quoted(id) + "\nlast_update_time: " + std::to_string(t) +
         "\nlifecycle_stage: active\nname: " + yaml_quoted(name) + "\n";
}

}  // namespace

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string sanitize_key(const std::string& key) {
  std::string out;
  for (char c : key) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == ' ' || c == '/';
    out += ok ? c : '_';
  }
  // '/' makes subdirectories, which MLflow reads back; empty, "." and ".." segments would
  // leave the run's directory or collide, so they become '_'.
  std::string clean, segment;
  std::istringstream parts(out);
  while (std::getline(parts, segment, '/')) {
    if (segment.empty() || segment == "." || segment == "..") segment = "_";
    clean += (clean.empty() ? "" : "/") + segment;
  }
  return clean.empty() ? "_" : clean;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

FileStore::FileStore(const fs::path& root) {
  std::error_code ec;
  const bool fresh = !fs::exists(root, ec);
  make_dirs(root);
  root_ = fs::canonical(root, ec);
  if (ec) fail("open", root, ec.message());
  if (!fs::is_directory(root_)) fail("open", root, "not a directory");
  // MLflow makes the Default experiment (id 0) only when it creates the root itself.
  if (fresh) {
    make_dirs(root_ / "0");
    write_yaml(root_ / "0" / "meta.yaml", experiment_yaml(root_, "0", "Default", now_ms()));
  }
  make_dirs(root_ / ".trash");
}

std::string FileStore::experiment(const std::string& name) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    if (!entry.is_directory() || entry.path().filename() == ".trash") continue;
    const std::string text = read_file(entry.path() / "meta.yaml");
    if (text.empty()) continue;
    if (yaml_value(text, "name") == name && yaml_value(text, "lifecycle_stage") == "active") {
      // The id becomes part of every path the run writes: only the directory's own name, all
      // digits (MLflow's ids), is taken; a meta.yaml that says otherwise was not written by MLflow.
      const std::string id = entry.path().filename().string();
      const bool digits = !id.empty() && id.size() <= 32 && std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits || yaml_value(text, "experiment_id") != id)
        fail("read", entry.path() / "meta.yaml", "its experiment_id is not its directory's name of digits");
      return id;
    }
  }
  if (ec) fail("list", root_, ec.message());
  // MLflow's own ids are large random integers; 18 digits keep them clear of its id rules.
  std::string id;
  do {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    id = std::to_string(100000000000000000ull + rng() % 900000000000000000ull);
  } while (fs::exists(root_ / id));
  make_dirs(root_ / id);
  write_yaml(root_ / id / "meta.yaml", experiment_yaml(root_, id, name, now_ms()));
  return id;
}

fs::path FileStore::create_run(const std::string& experiment_id, const std::string& run_id,
                               const std::string& run_name, const std::string& user, int64_t start_ms) {
  experiment_id_ = experiment_id, run_id_ = run_id, run_name_ = run_name, user_ = user, start_ms_ = start_ms;
  const fs::path dir = root_ / experiment_id / run_id;
  for (const char* sub : {"metrics", "params", "tags", "artifacts"}) make_dirs(dir / sub);
  write_run_meta(dir, RunStatus::Running, -1);
  return dir;
}

void FileStore::end_run(const fs::path& run_dir, RunStatus status, int64_t end_ms) {
  write_run_meta(run_dir, status, end_ms);
}

void FileStore::write_run_meta(const fs::path& run_dir, RunStatus status, int64_t end_ms) {
  // The keys create_run writes (_make_persisted_run_info_dict plus deleted_time), sorted.
  std::string y;
  y += "artifact_uri: " + yaml_quoted(file_uri(run_dir / "artifacts")) + "\n";
  y += "deleted_time: null\n";
  y += "end_time: " + (end_ms < 0 ? std::string("null") : std::to_string(end_ms)) + "\n";
  y += "entry_point_name: ''\n";
  y += "experiment_id: " + yaml_quoted(experiment_id_) + "\n";
  y += "lifecycle_stage: active\n";
  y += "run_id: " + yaml_quoted(run_id_) + "\n";
  y += "run_name: " + yaml_quoted(run_name_) + "\n";
  y += "run_uuid: " + yaml_quoted(run_id_) + "\n";
  y += "source_name: ''\n";
  y += "source_type: 4\n";  // SourceType.LOCAL
  y += "source_version: ''\n";
  y += "start_time: " + std::to_string(start_ms_) + "\n";
  y += "status: " + std::to_string(static_cast<int>(status)) + "\n";
  y += "tags: []\n";
  y += "user_id: " + yaml_quoted(user_) + "\n";
  write_yaml(run_dir / "meta.yaml", y);
}

void FileStore::write_value(const fs::path& file, const std::string& value) {
  make_dirs(file.parent_path());
  std::ofstream out(file, std::ios::trunc);
  out << value;
  out.flush();
  if (!out) fail("write", file, std::strerror(errno));
}

void FileStore::write_artifact(const fs::path& file, const std::string& bytes) {
  make_dirs(file.parent_path());
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.flush();
  if (!out) fail("write", file, std::strerror(errno));
}

void FileStore::append_metric(const fs::path& file, int64_t timestamp_ms, double value, int64_t step) {
  make_dirs(file.parent_path());
  std::ofstream out(file, std::ios::app);
  out << timestamp_ms << ' ' << format_value(value) << ' ' << step << '\n';
  out.flush();
  if (!out) fail("write", file, std::strerror(errno));
}

std::string new_run_id() { return random_hex(32); }

}  // namespace hasten::mlflow
