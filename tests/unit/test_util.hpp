// Helpers shared by the unit tests.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

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

inline std::string test_plugin(const std::string& dir, const std::string& file) {
  return std::string(HASTEN_TEST_PLUGIN_DIR) + "/" + dir + "/" + file;
}

}  // namespace hasten::test
