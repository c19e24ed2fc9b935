// Reading a checkpoint's files once: each file is read front to back a single time, its
// CRC-32C computed over the bytes as they arrive and compared with the manifest at the end,
// and each tensor goes straight into the storage the caller names for it (a live parameter,
// an optimizer state tensor) or into a new tensor. Loading therefore costs one read of the
// bytes a rank needs, not a verifying pass over every file and a second, loading one.
#pragma once

#include <hasten/error.hpp>
#include <hasten/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace hasten::detail {

// A file whose bytes do not match the manifest's checksum (or size): the checkpoint is damaged.
// load_state() without a directory skips such a checkpoint and tries the next older one.
class CorruptCheckpointFile : public Error {
 public:
  using Error::Error;
};

// Where one tensor of a file goes: a tensor to read it into, or an undefined tensor for a new
// one. A destination that is not contiguous, on the CPU, of the entry's dtype and number of
// elements is ignored (a new tensor is made).
using Placement = std::function<torch::Tensor(const SafetensorsEntry&)>;

// Reads the safetensors file `name` of checkpoint `dir` (listed in `manifest`), verifying it
// as it goes. Returns its tensors in file order (placed ones as the destinations given).
// Throws CorruptCheckpointFile naming the file when its size or checksum differs from the
// manifest's (also when the damage made the header unreadable), Error for anything else.
NamedTensors read_checked(const std::filesystem::path& dir, const std::string& name, const nlohmann::json& manifest,
                          const Placement& place = {});

// The whole file as bytes, verified the same way.
std::string read_checked_bytes(const std::filesystem::path& dir, const std::string& name,
                               const nlohmann::json& manifest);

// Verifies one listed file's checksum without keeping its bytes (files no rank loads).
void verify_checked(const std::filesystem::path& dir, const std::string& name, const nlohmann::json& manifest);

// A safetensors file of a checkpoint read in ranges, so that a rank reads only the slices it
// keeps: every range is rounded out to the chunks whose CRC-32C the manifest lists
// (checkpoint_files.hpp, kChunkSize), and each chunk touched is verified as it is read.
class RangedFile {
 public:
  // Whether the manifest lists the file's chunk checksums (checkpoints written before they
  // existed do not: such a file is read whole, read_checked).
  static bool available(const nlohmann::json& manifest, const std::string& name);
  // Opens the file, checks its size and reads and verifies its header (CorruptCheckpointFile
  // when damaged, Error when well-formed but not safetensors).
  RangedFile(const std::filesystem::path& dir, const std::string& name, const nlohmann::json& manifest);
  ~RangedFile();
  RangedFile(const RangedFile&) = delete;
  RangedFile& operator=(const RangedFile&) = delete;

  const SafetensorsHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  // Elements [offset, offset + dst.numel()) of entry e, flattened, into dst (any shape, device
  // and dtype: read straight into it when it is a contiguous CPU tensor of e's dtype).
  void read(const SafetensorsEntry& e, int64_t offset, torch::Tensor& dst);

 private:
  void read_bytes(uint64_t begin, uint64_t end, char* dst);
  void read_chunk(uint64_t chunk, char* dst);

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0, chunk_size_ = 0;
  std::vector<std::string> chunk_crc_;
  std::vector<char> scratch_;
  SafetensorsHeader header_;
};

}  // namespace hasten::detail
