// formats/ on its own: CRC-32C and SHA-256 against their published check values, durable
// writes (a file's record, chunk checksums, replace_file's all-or-nothing) and the errors that
// name the path. Linked with the util, formats and launch objects only: no LibTorch, no plugins.
#include <gtest/gtest.h>

#include <fstream>
#include <stdexcept>
#include <string>
#include <unistd.h>

#include "formats/checksum.hpp"
#include "formats/file_records.hpp"

namespace {

using hasten::detail::crc32c_update;

struct Dir {
  std::filesystem::path path;
  Dir() {
    char tmpl[] = "/tmp/hasten-formats-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~Dir() { std::filesystem::remove_all(path); }
};

uint32_t crc_of(const std::string& s) { return crc32c_update(0, s.data(), s.size()); }

}  // namespace

TEST(Checksum, Crc32cMatchesItsCheckValueAndIsIncremental) {
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);  // the CRC-32C check value (RFC 3720)
  EXPECT_EQ(crc_of(""), 0u);
  EXPECT_EQ(crc_of(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  const std::string text = "The quick brown fox jumps over the lazy dog";
  uint32_t crc = 0;
  for (size_t at = 0; at < text.size(); at += 5) crc = crc32c_update(crc, text.data() + at, std::min<size_t>(5, text.size() - at));
  EXPECT_EQ(crc, crc_of(text));
}

TEST(Checksum, Sha256MatchesFips180Vectors) {
  hasten::detail::Sha256 abc;
  abc.update("abc", 3);
  EXPECT_EQ(abc.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  hasten::detail::Sha256 empty;
  EXPECT_EQ(empty.hex(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // Fed in pieces that straddle the 64-byte blocks.
  const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  hasten::detail::Sha256 pieces;
  for (size_t at = 0; at < two.size(); at += 7) pieces.update(two.data() + at, std::min<size_t>(7, two.size() - at));
  EXPECT_EQ(pieces.hex(), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(FileRecords, WriteFileRecordsSizeCrcAndChunks) {
  Dir d;
  const std::string bytes = "0123456789abcdefghij";  // 20 bytes: chunks of 8, 8 and 4
  const auto record = hasten::detail::write_file(
      d.path, "data.bin", [&](const hasten::detail::ByteSink& sink) { sink(bytes.data(), bytes.size()); }, 8);
  EXPECT_EQ(record.name, "data.bin");
  EXPECT_EQ(record.size, 20u);
  EXPECT_EQ(record.crc32c, crc_of(bytes));
  ASSERT_EQ(record.chunk_crc32c.size(), 3u);
  EXPECT_EQ(record.chunk_crc32c[0], crc_of(bytes.substr(0, 8)));
  EXPECT_EQ(record.chunk_crc32c[2], crc_of(bytes.substr(16)));
  EXPECT_EQ(hasten::detail::read_file(d.path / "data.bin"), bytes);
}

TEST(FileRecords, ReplaceFileIsAllOrNothing) {
  Dir d;
  const auto path = d.path / "index.json";
  hasten::detail::replace_file(path, [](const hasten::detail::ByteSink& sink) { sink("old", 3); });
  // A producer that fails half-way leaves the old file whole and no temporary behind.
  EXPECT_THROW(hasten::detail::replace_file(path,
                                            [](const hasten::detail::ByteSink& sink) {
                                              sink("new and", 7);
                                              throw std::runtime_error("disk full");
                                            }),
               std::runtime_error);
  EXPECT_EQ(hasten::detail::read_file(path), "old");
  EXPECT_FALSE(std::filesystem::exists(d.path / "index.json.tmp"));
  hasten::detail::replace_file(path, [](const hasten::detail::ByteSink& sink) { sink("new", 3); });
  EXPECT_EQ(hasten::detail::read_file(path), "new");
}

TEST(FileRecords, ErrorsNameThePath) {
  Dir d;
  try {
    (void)hasten::detail::read_file(d.path / "absent.bin");
    FAIL() << "reading a missing file must throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("absent.bin"), std::string::npos) << e.what();
  }
  EXPECT_EQ(hasten::detail::parent_or_dot("name"), ".");
  EXPECT_EQ(hasten::detail::parent_or_dot("a/b/name"), "a/b");
}
