// Durable file writes (file_records.hpp). No LibTorch here.
#include "formats/file_records.hpp"

#include <hasten/error.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "formats/checksum.hpp"

namespace fs = std::filesystem;

namespace hasten::detail {

// The messages name the checkpoint: these writes are what save_state is made of (and the
// weights files, trackers' logs and indexes reuse them).
void file_error(const std::string& what, const fs::path& path) {
  throw Error("checkpoint: cannot " + what + " '" + path.string() + "': " + std::strerror(errno));
}

std::string parent_or_dot(const fs::path& p) { return p.parent_path().empty() ? std::string(".") : p.parent_path().string(); }

namespace {

// Writes all of p[0, size) to fd; throws naming path.
void write_all(int fd, const char* p, size_t size, const fs::path& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) file_error("write", path);
    p += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) file_error("open", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && !directory) file_error("flush", path);
}

FileRecord write_file(const fs::path& dir, const std::string& name, const std::function<void(const ByteSink&)>& produce,
                      uint64_t chunk_size) {
  const fs::path path = dir / name;
  // The directory is the save's own, made anew: a file that exists already (or a link put in
  // its place) is not overwritten or followed.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) file_error("create", path);
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
      write_all(fd, p, size, path);
    });
    if (::fsync(fd) != 0) file_error("flush", path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) file_error("close", path);
  return rec;
}

void replace_file(const fs::path& path, const std::function<void(const ByteSink&)>& produce) {
  const fs::path tmp = path.string() + ".tmp";
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) file_error("remove the stale", tmp);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) file_error("create", tmp);
  try {
    produce([&](const void* data, size_t size) { write_all(fd, static_cast<const char*>(data), size, tmp); });
    if (::fsync(fd) != 0) file_error("flush", tmp);
    if (::close(fd) != 0) {
      ::unlink(tmp.c_str());
      file_error("close", tmp);
    }
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    errno = e;
    file_error("rename '" + tmp.string() + "' to", path);
  }
  fsync_path(parent_or_dot(path), true);
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

}  // namespace hasten::detail
