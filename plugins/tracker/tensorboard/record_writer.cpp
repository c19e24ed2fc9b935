#include "record_writer.hpp"

#include <hasten/plugin.hpp>

#include <boost/crc.hpp>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace hasten::tensorboard {

namespace {

[[noreturn]] void fail_io(const std::string& what, const std::string& path, int err) {
  throw hasten::sdk::Error(HASTEN_ERR_SYSTEM, "tensorboard: cannot " + what + " " + path + ": " + std::strerror(err));
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t masked_crc32c(std::string_view data) {
  // Reflected CRC-32C: polynomial 0x1EDC6F41, init and final XOR 0xFFFFFFFF.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data.data(), data.size());
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

RecordWriter::~RecordWriter() {
  if (file_ == nullptr) return;
  try {
    close();
  } catch (...) {
    // Destruction cannot report: the tracker's finish() and flush() are where a failed write
    // surfaces, and by now the host has either seen it or is unwinding from another error.
  }
}

void RecordWriter::open(const std::string& path) {
  // O_EXCL: two runs never share an event file (TensorBoard would merge them into one run).
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail_io("create", path, errno);
  file_ = ::fdopen(fd, "wb");
  if (file_ == nullptr) {
    const int err = errno;
    ::close(fd);
    fail_io("open", path, err);
  }
  path_ = path;
}

void RecordWriter::append(std::string_view data) {
  std::string header;
  put_le(header, data.size(), 8);
  const uint32_t header_crc = masked_crc32c(header);
  buffer_ += header;
  put_le(buffer_, header_crc, 4);
  buffer_.append(data.data(), data.size());
  put_le(buffer_, masked_crc32c(data), 4);
  ++buffered_records_;
}

void RecordWriter::flush() {
  if (file_ == nullptr) return;
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size())
    fail_io("write", path_, errno);
  buffer_.clear();
  buffered_records_ = 0;
  if (std::fflush(file_) != 0) fail_io("write", path_, errno);
}

void RecordWriter::close() {
  if (file_ == nullptr) return;
  std::FILE* f = file_;
  int err = 0;
  try {
    flush();
  } catch (...) {
    file_ = nullptr;
    std::fclose(f);
    throw;
  }
  file_ = nullptr;
  if (std::fclose(f) != 0) err = errno;
  if (err != 0) fail_io("close", path_, err);
}

}  // namespace hasten::tensorboard
