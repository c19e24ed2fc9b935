// safetensors: every dtype round-trips bit for bit, empty tensors, scalars and metadata too;
// files laid out differently from ours are read; hand-made malformed files are refused with
// a specific hasten::Error, never a crash; a load reads into the tensors without a second copy.
#include <gtest/gtest.h>
#include <hasten/error.hpp>
#include <hasten/safetensors.hpp>
#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "test_util.hpp"

namespace {

using hasten::NamedTensors;

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A file: the header's size, the header, the data.
std::string file_of(const std::string& header, const std::string& data = "") { return le64(header.size()) + header + data; }

std::string write_bytes(const hasten::test::TempDir& dir, const std::string& name, const std::string& bytes) {
  const auto path = (dir.path() / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string bytes_of(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

// Same names in the same order, dtypes, shapes and bytes.
void expect_bitwise_equal(const NamedTensors& want, const NamedTensors& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].first);
    EXPECT_EQ(want[i].first, got[i].first);
    EXPECT_EQ(want[i].second.scalar_type(), got[i].second.scalar_type());
    EXPECT_EQ(want[i].second.sizes(), got[i].second.sizes());
    EXPECT_EQ(bytes_of(want[i].second), bytes_of(got[i].second));
  }
}

torch::Tensor halves(torch::ScalarType type) {
  // Values that need all of a 16-bit float: signed zero, infinities, NaN, the extremes and a
  // subnormal, then ordinary random ones.
  const float inf = std::numeric_limits<float>::infinity();
  auto special = torch::tensor({0.0f, -0.0f, inf, -inf, std::nanf(""), 65504.0f, 6e-8f, -1.5f, 3.140625f});
  return torch::cat({special, torch::randn({23})}).to(type);
}

TEST(Safetensors, EveryDtypeRoundTripsBitForBit) {
  hasten::test::TempDir dir;
  torch::manual_seed(1);
  const double dinf = std::numeric_limits<double>::infinity();
  auto i64 = std::numeric_limits<int64_t>::max();
  const NamedTensors tensors = {
      {"f64", torch::tensor({0.0, -0.0, 1e308, 5e-324, -dinf, std::nan(""), 1.0 / 3.0}, torch::kDouble)},
      {"f32", torch::randn({3, 5}).t()},  // not contiguous: written as its contiguous copy
      {"f16", halves(torch::kHalf).reshape({4, 8})},
      {"bf16", halves(torch::kBFloat16)},
      {"i64", torch::tensor({-i64 - 1, i64, int64_t{-1}, int64_t{0}}, torch::kLong)},
      {"i32", torch::tensor({std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), 7}, torch::kInt)},
      {"i16", torch::tensor({-32768, 32767, -2}, torch::kInt).to(torch::kShort)},
      {"i8", torch::tensor({-128, 127, 0, -1}, torch::kInt).to(torch::kChar)},
      {"u8", torch::arange(256, torch::kInt).to(torch::kByte).reshape({16, 16})},
      {"bool", torch::tensor({1, 0, 0, 1, 1}, torch::kInt).to(torch::kBool)},
      {"slice", torch::arange(20, torch::kFloat).narrow(0, 5, 7)},  // a view with a storage offset
  };
  const std::string path = (dir.path() / "all.safetensors").string();
  hasten::save_safetensors(path, tensors);
  expect_bitwise_equal(tensors, hasten::load_safetensors(path));

  const hasten::SafetensorsHeader header = hasten::read_safetensors_header(path);
  EXPECT_EQ(header.data_start % 8, 0u) << "the data should start 8-byte aligned";
  ASSERT_EQ(header.tensors.size(), tensors.size());
  EXPECT_EQ(header.tensors[2].name, "f16");
  EXPECT_EQ(header.tensors[2].dtype, torch::kHalf);
  EXPECT_EQ(header.tensors[2].shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(header.tensors[2].end - header.tensors[2].begin, 64u);

  // The streaming writer produces the very bytes save_safetensors put in the file.
  std::string streamed;
  hasten::write_safetensors(tensors, {{"format", "pt"}},
                            [&](const void* p, size_t n) { streamed.append(static_cast<const char*>(p), n); });
  EXPECT_EQ(streamed, read_bytes(path));
}

TEST(Safetensors, EmptyTensorsAndScalarsRoundTrip) {
  hasten::test::TempDir dir;
  const NamedTensors tensors = {
      {"scalar", torch::tensor(2.5)},
      {"empty", torch::empty({0, 3})},
      {"step", torch::tensor(int64_t{41})},
      {"empty_long", torch::empty({4, 0, 2}, torch::kLong)},
      {"flag", torch::tensor(true)},
      {"empty_1d", torch::empty({0}, torch::kBFloat16)},
  };
  const std::string path = (dir.path() / "small.safetensors").string();
  hasten::save_safetensors(path, tensors);
  const NamedTensors loaded = hasten::load_safetensors(path);
  expect_bitwise_equal(tensors, loaded);
  EXPECT_EQ(loaded[0].second.dim(), 0);
  EXPECT_EQ(loaded[0].second.item<double>(), 2.5);
  EXPECT_EQ(loaded[2].second.item<int64_t>(), 41);

  const std::string none = (dir.path() / "none.safetensors").string();
  hasten::save_safetensors(none, {}, {});
  EXPECT_TRUE(hasten::load_safetensors(none).empty());
}

TEST(Safetensors, MetadataRoundTrips) {
  hasten::test::TempDir dir;
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"note", "gr\xc3\xbc\xc3\x9f \"quoted\"\nsecond line"}, {"empty", ""}};
  const std::string path = (dir.path() / "meta.safetensors").string();
  hasten::save_safetensors(path, {{"w", torch::ones({2})}}, metadata);
  EXPECT_EQ(hasten::read_safetensors_header(path).metadata, metadata);

  const std::string bare = (dir.path() / "bare.safetensors").string();
  hasten::save_safetensors(bare, {{"w", torch::ones({2})}}, {});
  EXPECT_TRUE(hasten::read_safetensors_header(bare).metadata.empty());
  EXPECT_EQ(read_bytes(bare).find("__metadata__"), std::string::npos);
}

// Layouts the format allows that our writer does not produce: JSON order unlike data order,
// no alignment padding, a long run of padding spaces, empty tensors sharing an offset.
TEST(Safetensors, FilesLaidOutByOtherWritersAreRead) {
  hasten::test::TempDir dir;
  std::string data(12, '\0');
  const int32_t ab[3] = {7, -8, 9};
  std::memcpy(data.data(), ab, 12);
  const std::string header =
      R"({"z":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"data_offsets":[4,12],"shape":[2],"dtype":"I32"},)"
      R"("a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},"e":{"dtype":"F64","shape":[3,0],"data_offsets":[0,0]},)"
      R"("__metadata__":{"k":"v"}})";
  for (const std::string& padding : {std::string(), std::string(1000, ' ')}) {
    const auto path = write_bytes(dir, "other.safetensors", file_of(header + padding, data));
    const NamedTensors t = hasten::load_safetensors(path);
    ASSERT_EQ(t.size(), 4u);
    // Data order: the empty ones at offset 0 (by name among equals), then a, then b.
    EXPECT_EQ(t[0].first, "e");
    EXPECT_EQ(t[1].first, "z");
    EXPECT_EQ(t[2].first, "a");
    EXPECT_EQ(t[2].second.item<int32_t>(), 7);
    EXPECT_EQ(t[3].first, "b");
    EXPECT_TRUE(torch::equal(t[3].second, torch::tensor({-8, 9}, torch::kInt)));
    EXPECT_EQ(hasten::read_safetensors_header(path).metadata.at("k"), "v");
  }
}

TEST(Safetensors, TheWriterRefusesWhatNoFileCanHold) {
  hasten::test::TempDir dir;
  const std::string path = (dir.path() / "bad.safetensors").string();
  auto refused = [&](const NamedTensors& tensors, const std::string& expect,
                     const std::map<std::string, std::string>& metadata = {{"format", "pt"}}) {
    try {
      hasten::save_safetensors(path, tensors, metadata);
      ADD_FAILURE() << "saved; expected an error containing: " << expect;
    } catch (const hasten::Error& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp")) << "a failed save leaves its temporary file";
  };
  refused({{"w", torch::ones({2})}, {"w", torch::ones({2})}}, "duplicate tensor name 'w'");
  refused({{"__metadata__", torch::ones({2})}}, "'__metadata__' names the file's metadata");
  refused({{"c", torch::ones({2}, torch::kComplexFloat)}}, "tensor 'c' has unsupported dtype ComplexFloat");
  refused({{"u", torch::Tensor()}}, "tensor 'u' is undefined");
  refused({{"\xff", torch::ones({2})}}, "is not valid UTF-8");
  refused({{"w", torch::ones({2})}}, "the metadata is not valid UTF-8", {{"k", "\xc3"}});
  refused({{"", torch::ones({2})}}, "a tensor has an empty name");
}

// The file is complete but cannot take its name (a non-empty directory has it): the error
// names both paths and the temporary file goes too.
TEST(Safetensors, AFailedRenameLeavesNoTemporaryFile) {
  hasten::test::TempDir dir;
  const std::string path = (dir.path() / "taken").string();
  std::filesystem::create_directories(dir.path() / "taken" / "inside");
  try {
    hasten::save_safetensors(path, {{"w", torch::ones({2})}}, {});
    ADD_FAILURE() << "saved over a non-empty directory";
  } catch (const hasten::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot rename '" + path + ".tmp' to '" + path + "'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp")) << "a failed rename leaves the temporary file";
  EXPECT_TRUE(std::filesystem::is_directory(dir.path() / "taken" / "inside"));
}

TEST(Safetensors, AMissingFileOrADirectoryIsAClearError) {
  hasten::test::TempDir dir;
  const std::string missing = (dir.path() / "missing.safetensors").string();
  EXPECT_THROW(
      {
        try {
          hasten::load_safetensors(missing);
        } catch (const hasten::Error& e) {
          EXPECT_NE(std::string(e.what()).find("cannot read '" + missing + "': No such file"), std::string::npos) << e.what();
          throw;
        }
      },
      hasten::Error);
  EXPECT_THROW(
      {
        try {
          hasten::load_safetensors(dir.path().string());
        } catch (const hasten::Error& e) {
          EXPECT_NE(std::string(e.what()).find("is not a regular file"), std::string::npos) << e.what();
          throw;
        }
      },
      hasten::Error);
}

// --- malformed files -------------------------------------------------------------------

struct Malformed {
  const char* name;
  std::string bytes;
  const char* expect;          // a distinctive part of the message
  bool header_valid = false;   // the header passes; only reading the data finds the fault
};

std::ostream& operator<<(std::ostream& os, const Malformed& m) { return os << m.name; }

// A well-formed entry: F32 [2, 2] at the given offsets.
std::string w(const std::string& name, const std::string& offsets) {
  return "\"" + name + R"(":{"dtype":"F32","shape":[2,2],"data_offsets":)" + offsets + "}";
}

std::vector<Malformed> corpus() {
  const std::string d16(16, '\0');
  const std::string sixty_five_ones = [] {
    std::string s = "[1";
    for (int i = 1; i < 65; ++i) s += ",1";
    return s + "]";
  }();
  return {
      {"empty_file", "", "the file is 0 bytes, too short for the 8-byte header size"},
      {"truncated_size_prefix", le64(2).substr(0, 5), "the file is 5 bytes, too short"},
      {"header_size_beyond_file", le64(100) + "{}", "declares a header of 100 bytes but only 2 bytes follow its size"},
      {"header_size_over_limit", le64(200'000'000) + "{}", "declares a header of 200000000 bytes, more than the limit of 100000000"},
      {"header_size_max_u64", le64(std::numeric_limits<uint64_t>::max()) + "{}", "more than the limit of 100000000"},
      {"header_size_zero", le64(0), "the header is not a JSON object (it must begin with '{')"},
      {"header_not_json", file_of("{this is not json}"), "the header is not valid JSON: parse error"},
      {"header_cut_short", file_of(R"({"w":{"dtype":"F32","sha)"), "the header is not valid JSON"},
      {"header_an_array", file_of("[1,2,3]"), "it must begin with '{'"},
      {"header_leading_space", file_of(" {}"), "it must begin with '{'"},
      {"header_padded_with_newline", file_of("{}\n"), "the header is padded with bytes other than spaces"},
      {"header_padded_with_nul", file_of(std::string("{}\0\0\0\0\0\0", 8)), "the header holds a NUL byte at offset 2"},
      {"nul_hiding_an_entry", file_of(std::string("{}\0", 3) + R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"),
       "the header holds a NUL byte at offset 2"},
      {"header_two_objects", file_of("{}{}"), "the header is not valid JSON"},
      {"name_not_utf8", file_of("{\"\xff\":{}}"), "the header is not valid JSON"},
      {"header_nested_too_deep", file_of(R"({"w":[[[[[[[[[[1]]]]]]]]]]})"), "the header nests deeper than 8 levels"},
      {"entry_not_object", file_of(R"({"w":[0,16]})", d16), "tensor 'w' is [0,16], not an object {dtype, shape, data_offsets}"},
      {"missing_dtype", file_of(R"({"w":{"shape":[2,2],"data_offsets":[0,16]}})", d16), "tensor 'w' has no dtype"},
      {"missing_shape", file_of(R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", d16), "tensor 'w' has no shape"},
      {"missing_data_offsets", file_of(R"({"w":{"dtype":"F32","shape":[2,2]}})", d16), "tensor 'w' has no data_offsets"},
      {"unknown_dtype", file_of(R"({"w":{"dtype":"F33","shape":[2,2],"data_offsets":[0,16]}})", d16),
       "tensor 'w' has dtype \"F33\"; supported: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL"},
      {"unsupported_dtype_u16", file_of(R"({"w":{"dtype":"U16","shape":[8],"data_offsets":[0,16]}})", d16),
       "tensor 'w' has dtype \"U16\"; supported"},
      {"dtype_not_string", file_of(R"({"w":{"dtype":4,"shape":[2,2],"data_offsets":[0,16]}})", d16), "tensor 'w' has dtype 4;"},
      {"shape_not_array", file_of(R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})", d16),
       "tensor 'w' has shape 4, not an array of dimensions"},
      {"negative_dimension", file_of(R"({"w":{"dtype":"F32","shape":[-2,-2],"data_offsets":[0,16]}})", d16),
       "tensor 'w' has the dimension -2; dimensions are non-negative integers"},
      {"fractional_dimension", file_of(R"({"w":{"dtype":"F32","shape":[2.0,2],"data_offsets":[0,16]}})", d16),
       "tensor 'w' has the dimension 2.0;"},
      {"string_dimension", file_of(R"({"w":{"dtype":"F32","shape":["2",2],"data_offsets":[0,16]}})", d16),
       "tensor 'w' has the dimension \"2\";"},
      {"too_many_dimensions", file_of(R"({"w":{"dtype":"F32","shape":)" + sixty_five_ones + R"(,"data_offsets":[0,4]}})", d16.substr(0, 4)),
       "tensor 'w' has 65 dimensions, more than 64"},
      {"element_count_overflow",
       file_of(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", d16),
       "tensor 'w' has a shape [4294967296,4294967296] whose element count overflows 64 bits"},
      {"element_count_overflow_beside_zero",
       file_of(R"({"w":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})"),
       "whose element count overflows 64 bits"},
      {"byte_size_overflow", file_of(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,16]}})", d16),
       "tensor 'w' has a shape [4611686018427387904] whose byte size overflows 64 bits"},
      {"offsets_one_number", file_of(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[16]}})", d16),
       "tensor 'w' has data_offsets [16], not two non-negative integers [begin, end]"},
      {"offsets_negative", file_of(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[-4,12]}})", d16),
       "tensor 'w' has data_offsets [-4,12], not two non-negative integers"},
      {"offsets_end_before_begin", file_of(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[16,0]}})", d16),
       "tensor 'w' has data_offsets [16, 0], which end before they begin"},
      {"size_mismatch", file_of("{" + w("w", "[0,12]") + "}", d16.substr(0, 12)),
       "tensor 'w' has data_offsets [0, 12] but F32 [2, 2] needs 16 bytes"},
      {"offsets_past_the_end", file_of("{" + w("w", "[0,16]") + "}", d16.substr(0, 8)),
       "tensor 'w' has data_offsets [0, 16] past the end of the data, which is 8 bytes (is the file truncated?)"},
      {"offsets_near_u64_max", file_of("{" + w("w", "[18446744073709551599,18446744073709551615]") + "}", d16),
       "has data_offsets [18446744073709551599, 18446744073709551615] past the end of the data, which is 16 bytes"},
      {"offsets_wrap_past_u64", file_of("{" + w("w", "[18446744073709551600,18446744073709551616]") + "}", d16),
       "not two non-negative integers"},
      {"file_truncated_in_data", file_of("{" + w("a", "[0,16]") + "," + w("b", "[16,32]") + "}", d16 + d16.substr(0, 3)),
       "tensor 'b' has data_offsets [16, 32] past the end of the data, which is 19 bytes"},
      {"overlapping_tensors", file_of("{" + w("a", "[0,16]") + "," + w("b", "[8,24]") + "}", d16 + d16.substr(0, 8)),
       "tensor 'b' (data_offsets [8, 24]) overlaps tensor 'a' (data_offsets [0, 16])"},
      {"same_offsets_twice", file_of("{" + w("a", "[0,16]") + "," + w("b", "[0,16]") + "}", d16),
       "tensor 'b' (data_offsets [0, 16]) overlaps tensor 'a'"},
      {"hole_between_tensors", file_of("{" + w("a", "[0,16]") + "," + w("b", "[20,36]") + "}", d16 + d16 + "1234"),
       "the 4 bytes between tensor 'a' (data_offsets [0, 16]) and tensor 'b' (data_offsets [20, 36]) belong to no tensor"},
      {"hole_at_the_start", file_of("{" + w("a", "[4,20]") + "}", d16 + "1234"),
       "the data begins with 4 bytes that belong to no tensor (the first, 'a', has data_offsets [4, 20])"},
      {"data_longer_than_covered", file_of("{" + w("a", "[0,16]") + "}", d16 + "12345678"),
       "the data after the header is 24 bytes but the tensors cover only 16; 8 bytes belong to no tensor"},
      {"data_without_tensors", file_of("{}", "12345678"), "the tensors cover only 0; 8 bytes belong to no tensor"},
      {"duplicate_tensor_name", file_of("{" + w("w", "[0,16]") + "," + w("w", "[16,32]") + "}", d16 + d16),
       "the header names 'w' twice"},
      {"duplicate_key_in_entry", file_of(R"({"w":{"dtype":"F32","dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})", d16),
       "the entry 'w' has the key 'dtype' twice"},
      {"metadata_not_object", file_of(R"({"__metadata__":"pt"})"), "__metadata__ is \"pt\", not an object of strings"},
      {"metadata_value_not_string", file_of(R"({"__metadata__":{"format":1}})"), "__metadata__ 'format' is 1, not a string"},
      {"metadata_key_twice", file_of(R"({"__metadata__":{"format":"pt","format":"np"}})"),
       "the entry '__metadata__' has the key 'format' twice"},
      {"empty_tensor_name", file_of(R"({"":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", d16),
       "a tensor has an empty name"},
      {"offsets_negative_begin_into_header", file_of(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})"),
       "tensor 'w' has data_offsets [-8,0], not two non-negative integers"},
      {"fractional_dimension_half", file_of(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", d16.substr(0, 8)),
       "tensor 'w' has the dimension 2.5;"},
      {"control_characters_in_name_stay_one_line", file_of(R"({"a\nb":{"dtype":"F32"}})"), "tensor 'a\\x0ab' has no shape"},
      {"bool_byte_not_0_or_1", file_of(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", std::string("\x01\x00\x02", 3)),
       "tensor 'm' is BOOL but holds the byte 2 at element 2; BOOL bytes are 0 or 1", true},
  };
}

class MalformedFile : public testing::TestWithParam<Malformed> {};

// The load, and where the fault is in the header the header read too, throw hasten::Error
// naming the file and the rule broken, in one line.
TEST_P(MalformedFile, IsRefusedWithAClearError) {
  const Malformed& m = GetParam();
  hasten::test::TempDir dir;
  const std::string path = write_bytes(dir, "bad.safetensors", m.bytes);
  auto expect_refused = [&](const std::function<void()>& read, const char* how) {
    SCOPED_TRACE(how);
    try {
      read();
      ADD_FAILURE() << "accepted; expected an error containing: " << m.expect;
    } catch (const hasten::Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("safetensors: '" + path + "': ", 0), 0u) << what;
      EXPECT_NE(what.find(m.expect), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  expect_refused([&] { hasten::load_safetensors(path); }, "load_safetensors");
  if (m.header_valid)
    EXPECT_NO_THROW(hasten::read_safetensors_header(path));
  else
    expect_refused([&] { hasten::read_safetensors_header(path); }, "read_safetensors_header");
}

INSTANTIATE_TEST_SUITE_P(Safetensors, MalformedFile, testing::ValuesIn(corpus()),
                         [](const testing::TestParamInfo<Malformed>& info) { return std::string(info.param.name); });

// --- memory --------------------------------------------------------------------------

uint64_t status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::strlen(field)));
  return 0;
}

// A 64 MiB tensor costs one 64 MiB allocation to load. The file is sparse (written without a
// tensor in memory) and the peak resident size is reset just before the load, so the peak it
// reaches counts what the load itself holds at once; a load through a buffer of the file's
// bytes would reach twice the size.
TEST(Safetensors, ALargeFileIsReadWithoutASecondCopy) {
  hasten::test::TempDir dir;
  constexpr int64_t kFloats = 16 << 20;  // 64 MiB of float32
  constexpr uint64_t kBytes = kFloats * 4;
  const std::string header =
      R"({"big":{"dtype":"F32","shape":[)" + std::to_string(kFloats) + R"(],"data_offsets":[0,)" + std::to_string(kBytes) + "]}}";
  const std::string path = write_bytes(dir, "big.safetensors", le64(header.size()) + header);
  const uint64_t data_start = 8 + header.size();
  {
    // The last element 1.0, all the others 0: a check that the bytes land where they belong.
    const float one = 1.0f;
    const int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(data_start + kBytes)), 0);
    ASSERT_EQ(::pwrite(fd, &one, 4, static_cast<off_t>(data_start + kBytes - 4)), 4);
    ::close(fd);
  }
  {
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";  // resets the peak resident size (VmHWM) to the current one
    if (!reset.flush()) GTEST_SKIP() << "this kernel does not let a process reset its peak resident size";
  }
  const uint64_t before = status_kib("VmHWM:");
  ASSERT_LE(before, status_kib("VmRSS:") + 1024) << "the peak resident size was not reset";
  const NamedTensors t = hasten::load_safetensors(path);
  const uint64_t grown = status_kib("VmHWM:") - before;
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].second.numel(), kFloats);
  EXPECT_EQ(t[0].second[kFloats - 1].item<float>(), 1.0f);
  EXPECT_EQ(t[0].second.sum().item<float>(), 1.0f);
  EXPECT_GE(grown, kBytes / 1024 / 2) << "the tensor's pages should have been touched by the read";
  EXPECT_LT(grown, kBytes / 1024 * 3 / 2) << "loading 64 MiB raised the peak resident size by " << grown << " KiB";
}

}  // namespace
