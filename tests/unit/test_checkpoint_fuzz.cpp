// Fuzz-style: a checkpoint's manifest.json and hasten_state.json, mutated (numbers swapped for
// negative, huge, fractional or quoted ones, bytes flipped, pieces cut or repeated, keys
// removed; the state file's manifest entry fixed up so that its content, not its checksum, is
// what is wrong) go through load_state. Each must load or end in one hasten::Error of one
// line, never another exception or a crash.
#include <hasten/hasten.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "fuzz_budget.hpp"
#include "test_util.hpp"

namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class JsonMutator {
 public:
  explicit JsonMutator(uint64_t seed) : rng_(seed) {}
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  std::string mutate(std::string text) {
    for (int k = 0, edits = 1 + static_cast<int>(below(3)); k < edits; ++k) {
      switch (below(6)) {
        case 0: {  // a number becomes another
          static const char* numbers[] = {"-1", "0", "2.5", "1e300", "18446744073709551615", "18446744073709551616",
                                          "9223372036854775807", "-9223372036854775808", "4294967296", "1099511627776",
                                          "null", "\"4\"", "[]", "{}", "true"};
          const size_t at = text.find_first_of("0123456789", below(text.size()));
          if (at == std::string::npos) break;
          const size_t end = text.find_first_not_of("0123456789", at);
          text.replace(at, end - at, numbers[below(sizeof numbers / sizeof *numbers)]);
          break;
        }
        case 1:
          if (!text.empty()) text[below(text.size())] = static_cast<char>(rng_() & 0xff);
          break;
        case 2:
          text.erase(below(text.size()), below(16));
          break;
        case 3: {
          const size_t at = below(text.size());
          text.insert(at, text.substr(at, below(32)));
          break;
        }
        case 4: {  // a "key": value pair removed, up to the next comma
          const size_t q = text.find("\":", below(text.size()));
          const size_t open = q == std::string::npos || q == 0 ? std::string::npos : text.rfind('"', q - 1);
          const size_t comma = q == std::string::npos ? q : text.find(',', q);
          if (open != std::string::npos && comma != std::string::npos) text.erase(open, comma - open + 1);
          break;
        }
        case 5: {  // a string value becomes another
          static const char* words[] = {"\"../x\"", "\"/etc/passwd\"", "\"\"", "\"pickle\"", "\"full\"", "\"per_rank\""};
          const size_t q = text.find(": \"", below(text.size()));
          if (q == std::string::npos) break;
          const size_t end = text.find('"', q + 3);
          if (end != std::string::npos) text.replace(q + 2, end - q - 1, words[below(sizeof words / sizeof *words)]);
          break;
        }
      }
    }
    return text;
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace

TEST(CheckpointFuzz, MutatedManifestsAndStateFilesLoadOrEndInOneError) {
  hasten::test::FuzzBudget budget(29, 2000);
  hasten::test::TempDir dir;
  hasten::Options o;
  o.project_dir = dir.path().string();
  o.automatic_checkpoint_naming = false;
  hasten::Accelerator acc(o);
  torch::manual_seed(1);
  torch::nn::Linear net(4, 2);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.1));
  auto prepared = acc.prepare(net, adam);
  auto& model = std::get<0>(prepared);
  acc.backward(model(torch::ones({3, 4})).pow(2).sum());
  adam.step();
  const fs::path good = dir.path() / "good";
  acc.save_state(good.string());
  const std::string manifest = read_all(good / "manifest.json"), state = read_all(good / "hasten_state.json");
  JsonMutator mutator(budget.seed());
  const fs::path ckpt = dir.path() / "mutated";
  int loaded = 0, refused = 0, i = 0;
  for (; budget.more(i); ++i) {
    fs::remove_all(ckpt);
    fs::copy(good, ckpt);
    if (mutator.below(2) == 0) {
      write_all(ckpt / "manifest.json", mutator.mutate(manifest));
    } else {
      const std::string text = mutator.mutate(state);
      write_all(ckpt / "hasten_state.json", text);
      auto m = nlohmann::json::parse(manifest);
      m["files"]["hasten_state.json"]["size"] = text.size();
      m["files"]["hasten_state.json"]["crc32c"] = hasten::test::crc32c_text(text);
      write_all(ckpt / "manifest.json", m.dump(1));
    }
    try {
      acc.load_state(ckpt.string());
      ++loaded;
    } catch (const hasten::Error& e) {
      ++refused;
      const std::string message = e.what();
      EXPECT_EQ(message.find('\n'), std::string::npos) << "case " << i << ": " << message;
      EXPECT_EQ(message.rfind("load_state: ", 0), 0u) << "case " << i << ": " << message;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << i << " (seed " << budget.seed() << ") threw a non-hasten error: " << e.what();
    }
    if (HasFailure()) break;
  }
  EXPECT_GT(refused, i / 3);
  std::printf("checkpoint fuzz: seed %llu, %d checkpoints, %d loaded, %d refused\n",
              static_cast<unsigned long long>(budget.seed()), i, loaded, refused);
}
