// Reading a checkpoint's files once, verifying their checksums as the bytes arrive.
#include "checkpoint_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "checksum.hpp"

namespace hasten::detail {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Checksummed in steps of this size right after each step is read, while the bytes are
// still in the cache.
constexpr uint64_t kStep = uint64_t{4} << 20;

std::string crc_text(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

// One listed file, open, with what the manifest expects of it.
class CheckedFile {
 public:
  CheckedFile(const fs::path& dir, const std::string& name, const json& manifest) : path_((dir / name).string()) {
    const json& files = manifest.at("files");
    if (!files.contains(name)) throw Error("load_state: the manifest of '" + dir.string() + "' does not list '" + name + "'");
    want_size_ = files[name].value("size", uint64_t{0});
    want_crc_ = files[name].value("crc32c", "");
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) throw CorruptCheckpointFile("checkpoint file '" + path_ + "' cannot be read: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw CorruptCheckpointFile("checkpoint file '" + path_ + "' is not a regular file");
    }
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size != want_size_) {
      ::close(fd_);
      throw CorruptCheckpointFile("checkpoint file '" + path_ + "' has " + std::to_string(size) + " bytes, the manifest says " +
                                  std::to_string(want_size_) + " (truncated or replaced)");
    }
  }
  ~CheckedFile() { ::close(fd_); }
  CheckedFile(const CheckedFile&) = delete;
  CheckedFile& operator=(const CheckedFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return want_size_; }
  uint64_t done() const { return done_; }

  // Reads the next `n` bytes of the file (they must follow the ones read so far) into dst and
  // adds them to the checksum.
  void next(void* dst, uint64_t n) {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      const uint64_t step = std::min(n, kStep);
      uint64_t got_total = 0;
      while (got_total < step) {
        const ssize_t got = ::pread(fd_, p + got_total, static_cast<size_t>(step - got_total), static_cast<off_t>(done_ + got_total));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) throw Error("checkpoint: reading '" + path_ + "' failed: " + std::strerror(errno));
        if (got == 0) throw CorruptCheckpointFile("checkpoint file '" + path_ + "' ended early (did it change meanwhile?)");
        got_total += static_cast<uint64_t>(got);
      }
      crc_ = crc32c_update(crc_, p, static_cast<size_t>(step));
      done_ += step;
      p += step;
      n -= step;
    }
  }

  // The rest of the file into the checksum only.
  void skip_rest() {
    std::vector<char> buf(static_cast<size_t>(std::min(kStep, std::max<uint64_t>(want_size_ - done_, 1))));
    while (done_ < want_size_) next(buf.data(), std::min<uint64_t>(buf.size(), want_size_ - done_));
  }

  bool matches() const { return done_ == want_size_ && crc_text(crc_) == want_crc_; }
  [[noreturn]] void corrupt() const {
    throw CorruptCheckpointFile("checkpoint file '" + path_ + "' does not match its checksum (corrupt)");
  }
  void finish() const {
    if (!matches()) corrupt();
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t want_size_ = 0;
  std::string want_crc_;
  uint64_t done_ = 0;
  uint32_t crc_ = 0;
};

// Runs `read`; when it fails for any reason but a damaged file, the file's checksum decides
// what is said: a header that a flipped bit made unreadable is reported as the corruption it
// is, not as the malformed safetensors it looks like.
template <class F>
auto verified(CheckedFile& file, F&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const CorruptCheckpointFile&) {
    throw;
  } catch (const std::exception&) {
    file.skip_rest();
    if (!file.matches()) file.corrupt();
    throw;
  }
}

bool usable(const torch::Tensor& t, const SafetensorsEntry& e) {
  return t.defined() && t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == e.dtype &&
         t.numel() == c10::multiply_integers(e.shape) && !t.is_sparse();
}

}  // namespace

NamedTensors read_checked(const fs::path& dir, const std::string& name, const json& manifest, const Placement& place) {
  CheckedFile file(dir, name, manifest);
  NamedTensors out = verified(file, [&] {
    const SafetensorsHeader header = read_safetensors_header(file.path());
    std::string head(static_cast<size_t>(header.data_start), '\0');
    file.next(head.data(), head.size());
    NamedTensors tensors;
    tensors.reserve(header.tensors.size());
    for (const SafetensorsEntry& e : header.tensors) {
      torch::Tensor t = place ? place(e) : torch::Tensor();
      if (!usable(t, e)) t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
      const uint64_t bytes = e.end - e.begin;
      if (header.data_start + e.begin != file.done())
        throw Error("safetensors: '" + file.path() + "': tensor '" + e.name + "' does not follow the one before it");
      if (bytes > 0) file.next(t.data_ptr(), bytes);
      if (e.dtype == torch::kBool) {
        const auto* b = static_cast<const uint8_t*>(t.data_ptr());
        if (std::any_of(b, b + bytes, [](uint8_t v) { return v > 1; }))
          throw Error("safetensors: '" + file.path() + "': tensor '" + e.name + "' is BOOL but holds a byte other than 0 or 1");
      }
      tensors.emplace_back(e.name, std::move(t));
    }
    return tensors;
  });
  file.finish();
  return out;
}

std::string read_checked_bytes(const fs::path& dir, const std::string& name, const json& manifest) {
  CheckedFile file(dir, name, manifest);
  std::string bytes(static_cast<size_t>(file.size()), '\0');
  file.next(bytes.data(), bytes.size());
  file.finish();
  return bytes;
}

void verify_checked(const fs::path& dir, const std::string& name, const json& manifest) {
  CheckedFile file(dir, name, manifest);
  file.skip_rest();
  file.finish();
}

}  // namespace hasten::detail
