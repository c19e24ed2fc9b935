// Fuzz-style: mutated safetensors headers (numbers swapped for negative, fractional, huge or
// empty ones, bytes flipped, cut or repeated, names emptied, the size prefix changed, the
// file truncated) go through load_safetensors. Each must load or end in one hasten::Error of
// one line naming the file, never another exception (LibTorch's carry stack frames) or a crash.
#include <hasten/error.hpp>
#include <hasten/safetensors.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include "fuzz_budget.hpp"
#include "test_util.hpp"

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  // `file` is 8 bytes of header size, the header, then the data.
  std::string mutate(std::string file) {
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(file[static_cast<size_t>(i)])) << (8 * i);
    std::string header = file.substr(8, n), data = file.substr(8 + n);
    bool keep_size = below(4) != 0;  // mostly the prefix follows the header's new length
    for (int k = 0, edits = 1 + static_cast<int>(below(3)); k < edits; ++k) {
      switch (below(7)) {
        case 0: {  // a number becomes another
          static const char* numbers[] = {"-1", "-8", "2.5", "2.0", "1e3", "18446744073709551616", "0", "", "null", "\"4\"", "4294967296"};
          const size_t at = header.find_first_of("0123456789", below(header.size()));
          if (at == std::string::npos) break;
          const size_t end = header.find_first_not_of("0123456789", at);
          header.replace(at, end - at, numbers[below(sizeof numbers / sizeof *numbers)]);
          break;
        }
        case 1:  // a byte flipped
          if (!header.empty()) header[below(header.size())] = static_cast<char>(rng_() & 0xff);
          break;
        case 2: {  // a piece cut out
          const size_t at = below(header.size());
          header.erase(at, below(12));
          break;
        }
        case 3: {  // a piece repeated
          const size_t at = below(header.size());
          header.insert(at, header.substr(at, below(24)));
          break;
        }
        case 4: {  // a tensor name emptied
          const size_t q = header.find("\":{\"dtype\"");
          const size_t open = q == std::string::npos ? q : header.rfind('"', q - 1);
          if (open != std::string::npos) header.erase(open + 1, q - open - 1);
          break;
        }
        case 5:  // the file cut short
          data = data.substr(0, below(data.size() + 1));
          break;
        case 6:  // a dtype changed
          if (const size_t at = header.find("F32"); at != std::string::npos) {
            static const char* dtypes[] = {"F64", "BOOL", "U16", "I8", "", "f32"};
            header.replace(at, 3, dtypes[below(sizeof dtypes / sizeof *dtypes)]);
          }
          break;
      }
    }
    uint64_t size = keep_size ? header.size() : (below(2) ? n : rng_());
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(size >> (8 * i));
    return out + header + data;
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace

TEST(SafetensorsFuzz, MutatedHeadersLoadOrEndInOneError) {
  hasten::test::FuzzBudget budget(11, 400);
  hasten::test::TempDir dir;
  const std::string good = (dir.path() / "good.safetensors").string();
  hasten::save_safetensors(good,
                           {{"weight", torch::arange(12, torch::kFloat).reshape({3, 4})},
                            {"bias", torch::ones({4}, torch::kDouble)},
                            {"mask", torch::tensor({true, false, true})},
                            {"empty", torch::zeros({0, 3}, torch::kInt)},
                            {"step", torch::tensor(int64_t{7})}},
                           {{"format", "pt"}});
  const std::string original = read_all(good);
  Mutator mutator(budget.seed());
  const std::string path = (dir.path() / "mutated.safetensors").string();
  int loaded = 0, refused = 0, i = 0;
  for (; budget.more(i); ++i) {
    const std::string bytes = mutator.mutate(original);
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    try {
      hasten::load_safetensors(path);
      ++loaded;
    } catch (const hasten::Error& e) {
      ++refused;
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("safetensors: '" + path + "': ", 0), 0u) << "case " << i << ": " << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << "case " << i << ": " << message;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << i << " (seed " << budget.seed() << ") threw a non-hasten error: " << e.what();
    }
    if (HasFailure()) break;
  }
  EXPECT_GT(refused, i / 2);
  std::printf("safetensors fuzz: seed %llu, %d files, %d loaded, %d refused\n",
              static_cast<unsigned long long>(budget.seed()), i, loaded, refused);
}
