// Helpers shared by the unit tests.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

#include <hasten/error.hpp>
#include <hasten/launch.hpp>

namespace hasten::test {

// A fresh directory, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "hasten-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text) const {
    const auto p = path_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  std::string read(const std::string& name) const {
    std::ifstream in(path_ / name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static std::string read_file(const std::filesystem::path& file) {
    std::ifstream in(file);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::filesystem::path path_;
};

// This executable's private HASTEN_HOME (empty: no user config file, no installed plugins), made
// once and removed at exit. Forked ranks leave through _exit, so only the parent removes it.
inline const std::filesystem::path& private_home() {
  static TempDir home;
  return home.path();
}

// For an Accelerator made in the test's own process: points HASTEN_HOME at the private home.
inline void isolate_home() { ::setenv("HASTEN_HOME", private_home().c_str(), 1); }

// `n` forked ranks with the private home and a 60 s collective timeout; `env` adds variables
// (HASTEN_TIMEOUT_S in it wins), `timeout_s` bounds the whole launch.
inline hasten::LaunchOptions with_ranks(int n, std::map<std::string, std::string> env = {}, double timeout_s = 120) {
  hasten::LaunchOptions o;
  o.num_processes = n;
  o.timeout_s = timeout_s;
  o.env = std::move(env);
  o.env["HASTEN_HOME"] = private_home().string();
  o.env.emplace("HASTEN_TIMEOUT_S", "60");
  return o;
}

// CRC-32C (Castagnoli), bit by bit, as 8 hex digits: the manifest's checksum of a file a
// test edited.
inline std::string crc32c_text(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : bytes) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc ^ 0xFFFFFFFFu);
  return buf;
}

// Fails a rank (and so the launch, which names the rank and this message) when `ok` is false.
inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

inline std::string test_plugin(const std::string& dir, const std::string& file) {
  return std::string(HASTEN_TEST_PLUGIN_DIR) + "/" + dir + "/" + file;
}

// What `fn` throws as a hasten::Error, or "(no error)": for checking a refusal's one line.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const hasten::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace hasten::test
