// Reading a checkpoint's files once, verifying their checksums as the bytes arrive.
#include "checkpoint/checkpoint_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "formats/checksum.hpp"

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

bool RangedFile::available(const json& manifest, const std::string& name) {
  const json& files = manifest.at("files");
  if (!files.contains(name)) return false;
  const json& f = files[name];
  return f.contains("chunk_size") && f["chunk_size"].is_number_unsigned() && f["chunk_size"].get<uint64_t>() > 0 &&
         f.contains("chunks") && f["chunks"].is_array();
}

RangedFile::RangedFile(const fs::path& dir, const std::string& name, const json& manifest) : path_((dir / name).string()) {
  const json& f = manifest.at("files").at(name);
  size_ = f.value("size", uint64_t{0});
  chunk_size_ = f.at("chunk_size").get<uint64_t>();
  for (auto& c : f.at("chunks")) chunk_crc_.push_back(c.is_string() ? c.get<std::string>() : "");
  // read_manifest bounded both; checked again here, without overflow, for any other caller.
  if (chunk_size_ == 0 || chunk_size_ > kMaxChunkSize || size_ > kMaxFileSize ||
      chunk_crc_.size() != size_ / chunk_size_ + (size_ % chunk_size_ != 0 ? 1 : 0))
    throw CorruptCheckpointFile("the manifest of '" + dir.string() + "' lists " + std::to_string(chunk_crc_.size()) +
                                " chunk checksums for '" + name + "', which has " + std::to_string(size_) + " bytes");
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) throw CorruptCheckpointFile("checkpoint file '" + path_ + "' cannot be read: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != size_) {
    const bool regular = S_ISREG(st.st_mode);
    ::close(fd_);
    throw CorruptCheckpointFile(regular ? "checkpoint file '" + path_ + "' has " + std::to_string(st.st_size) +
                                              " bytes, the manifest says " + std::to_string(size_) + " (truncated or replaced)"
                                        : "checkpoint file '" + path_ + "' is not a regular file");
  }
  try {
    // The header's bytes are verified before they are parsed: a flipped bit is reported as
    // the corruption it is, not as a malformed header.
    char length[8] = {};
    if (size_ < 8) throw Error("safetensors: '" + path_ + "' is shorter than its 8-byte header length");
    read_bytes(0, 8, length);
    uint64_t n = 0;
    std::memcpy(&n, length, 8);  // little-endian, as the format says (and every host hasten runs on)
    if (n <= size_ - 8 && n <= kSafetensorsMaxHeaderBytes) {  // the parser refuses a longer one
      std::vector<char> head(static_cast<size_t>(8 + n));
      read_bytes(0, 8 + n, head.data());
    }
    header_ = read_safetensors_header(path_);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

RangedFile::~RangedFile() { ::close(fd_); }

void RangedFile::read_chunk(uint64_t chunk, char* dst) {
  const uint64_t begin = chunk * chunk_size_, n = std::min(chunk_size_, size_ - begin);
  for (uint64_t got_total = 0; got_total < n;) {
    const ssize_t got = ::pread(fd_, dst + got_total, static_cast<size_t>(n - got_total), static_cast<off_t>(begin + got_total));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error("checkpoint: reading '" + path_ + "' failed: " + std::strerror(errno));
    if (got == 0) throw CorruptCheckpointFile("checkpoint file '" + path_ + "' ended early (did it change meanwhile?)");
    got_total += static_cast<uint64_t>(got);
  }
  if (crc_text(crc32c_update(0, dst, static_cast<size_t>(n))) != chunk_crc_[chunk])
    throw CorruptCheckpointFile("checkpoint file '" + path_ + "' does not match its checksum (corrupt: bytes " +
                                std::to_string(begin) + " to " + std::to_string(begin + n) + ")");
}

void RangedFile::read_bytes(uint64_t begin, uint64_t end, char* dst) {
  if (begin >= end) return;
  for (uint64_t c = begin / chunk_size_; c * chunk_size_ < end; ++c) {
    const uint64_t cb = c * chunk_size_, ce = std::min(cb + chunk_size_, size_);
    if (cb >= begin && ce <= end) {
      read_chunk(c, dst + (cb - begin));  // a whole chunk: straight into place
      continue;
    }
    scratch_.resize(static_cast<size_t>(std::min(chunk_size_, size_)));
    read_chunk(c, scratch_.data());
    const uint64_t lo = std::max(cb, begin), hi = std::min(ce, end);
    std::memcpy(dst + (lo - begin), scratch_.data() + (lo - cb), static_cast<size_t>(hi - lo));
  }
}

void RangedFile::read(const SafetensorsEntry& e, int64_t offset, torch::Tensor& dst) {
  const int64_t numel = c10::multiply_integers(e.shape), n = dst.numel();
  if (offset < 0 || n < 0 || offset + n > numel)
    throw Error("load_state: '" + path_ + "': elements " + std::to_string(offset) + " to " + std::to_string(offset + n) +
                " of '" + e.name + "' were asked for; it has " + std::to_string(numel));
  if (n == 0) return;
  const auto element = static_cast<uint64_t>(c10::elementSize(e.dtype));
  const uint64_t begin = header_.data_start + e.begin + static_cast<uint64_t>(offset) * element;
  const uint64_t bytes = static_cast<uint64_t>(n) * element;
  const bool direct = dst.device().is_cpu() && dst.is_contiguous() && dst.scalar_type() == e.dtype && !dst.is_sparse();
  torch::Tensor target = direct ? dst : torch::empty({n}, torch::TensorOptions().dtype(e.dtype));
  read_bytes(begin, begin + bytes, static_cast<char*>(target.data_ptr()));
  if (e.dtype == torch::kBool) {
    const auto* b = static_cast<const uint8_t*>(target.data_ptr());
    if (std::any_of(b, b + bytes, [](uint8_t v) { return v > 1; }))
      throw Error("safetensors: '" + path_ + "': tensor '" + e.name + "' is BOOL but holds a byte other than 0 or 1");
  }
  if (!direct) {
    at::NoGradGuard no_grad;
    dst.copy_(target.reshape(dst.sizes()));
  }
}

}  // namespace hasten::detail
