// A file written durably: through a sink that checksums the bytes as they go (CRC-32C, and per
// chunk for files read in ranges), flushed to disk, or replacing a file so that a reader or a
// kill sees the old or the new one whole. What checkpoints, safetensors files and indexes are
// written with. No LibTorch here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace hasten::detail {

struct FileRecord {
  std::string name;  // relative to the checkpoint directory
  uint64_t size = 0;
  uint32_t crc32c = 0;
  // With chunk_size > 0, also the CRC-32C of each chunk_size bytes (the last one shorter):
  // a rank that reads only ranges of the file verifies the chunks it touches.
  uint64_t chunk_size = 0;
  std::vector<uint32_t> chunk_crc32c;
};

// Writes a file durably (written, fsync'ed) through `produce`, which calls the sink with the
// file's bytes in order; chunk_size > 0 records the chunks' checksums too. Throws Error naming
// the path (disk full, permission).
using ByteSink = std::function<void(const void* data, size_t size)>;
FileRecord write_file(const std::filesystem::path& dir, const std::string& name,
                      const std::function<void(const ByteSink&)>& produce, uint64_t chunk_size = 0);
FileRecord write_file(const std::filesystem::path& dir, const std::string& name, const std::string& bytes);

// Replaces the file at path with what `produce` writes, so that a reader (or a kill at any
// moment) sees the old file or the new one whole: written to "PATH.tmp" (a stale one removed
// first, then created O_EXCL|O_NOFOLLOW: a link planted there is not followed), flushed,
// renamed over path, the directory flushed. Throws Error naming the path; the temporary file
// is removed on every failure.
void replace_file(const std::filesystem::path& path, const std::function<void(const ByteSink&)>& produce);

// Reads a whole file; throws Error naming it.
std::string read_file(const std::filesystem::path& path);

// Throws Error "checkpoint: cannot <what> '<path>': <strerror(errno)>".
[[noreturn]] void file_error(const std::string& what, const std::filesystem::path& path);

// The directory a path is in ("." for a bare name).
std::string parent_or_dot(const std::filesystem::path& p);

// Flushes a file or a directory (an entry made or renamed in it) to disk; throws naming it,
// but for a directory, whose flush some file systems refuse.
void fsync_path(const std::filesystem::path& path, bool directory);

}  // namespace hasten::detail
