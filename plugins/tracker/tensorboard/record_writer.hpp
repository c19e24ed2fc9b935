// TFRecord framing of an event file: every record is
//   uint64 length | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// (little-endian), the framing TensorBoard's reader checks record by record.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace hasten::tensorboard {

// CRC-32C (Castagnoli) of data, masked as TFRecord stores it: rotated right by 15 bits plus
// 0xa282ead8, so that a CRC computed over data that itself holds CRCs stays informative.
uint32_t masked_crc32c(std::string_view data);

// Appends framed records to one file. Records are buffered and reach the file on flush();
// only whole records are written, so a reader never sees half a record from us.
class RecordWriter {
 public:
  RecordWriter() = default;
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;

  // Creates the file (it must not exist); throws hasten::sdk::Error naming the path.
  void open(const std::string& path);
  bool is_open() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }
  // Frames one serialized record into the buffer.
  void append(std::string_view data);
  size_t buffered_records() const { return buffered_records_; }
  // Writes the buffer and flushes the file; throws hasten::sdk::Error naming the path.
  void flush();
  // Flushes and closes; throws like flush(), and closes the file either way.
  void close();

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
  std::string buffer_;
  size_t buffered_records_ = 0;
};

}  // namespace hasten::tensorboard
