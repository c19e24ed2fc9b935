// Accelerator::profile: LibTorch's profiler over a window of the optimizer steps that follow
// the call, one Chrome trace per rank; a window while one is open, or bad counts, is a
// UsageError; a later window of the same run writes a numbered file next to the first.
#include <hasten/hasten.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace profile_api_tests {

namespace fs = std::filesystem;

// How many times the trace records `name` as a range.
size_t ranges(const fs::path& trace, const std::string& name) {
  std::ifstream in(trace);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string needle = "\"name\": \"" + name + "\"";
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

std::vector<fs::path> traces(const fs::path& dir) {
  std::vector<fs::path> out;
  if (fs::exists(dir))
    for (auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ProfileApi, RecordsTheActiveStepsOfAWindowFromTheCall) {
  hasten::test::isolate_home();
  hasten::test::TempDir dir;
  const fs::path out = dir.path() / "profile";
  hasten::Accelerator acc;
  torch::manual_seed(0);
  auto net = torch::nn::Linear(4, 2);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, opt] = acc.prepare(net, sgd);
  auto step = [&] {
    acc.backward(model(torch::randn({8, 4})).pow(2).mean());
    opt.step();
    opt.zero_grad();
  };
  for (int i = 0; i < 3; ++i) step();  // before the call: not counted
  acc.profile({.wait = 1, .warmup = 1, .active = 2, .dir = out.string()});
  EXPECT_THROW(acc.profile({.active = 1, .dir = out.string()}), hasten::UsageError) << "a window is open";
  for (int i = 0; i < 3; ++i) step();
  EXPECT_TRUE(traces(out).empty()) << "the window ends after its 2 active steps, not before";
  step();
  auto files = traces(out);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename().string().find("_rank0.pt.trace.json") != std::string::npos, true) << files[0];
  EXPECT_EQ(ranges(files[0], "hasten::optimizer_step"), 2u) << "exactly the 2 active steps";
  EXPECT_EQ(ranges(files[0], "hasten::backward"), 2u);

  // A second window of the same run: its own file, numbered.
  acc.profile({.wait = 0, .warmup = 0, .active = 1, .dir = out.string()});
  step();
  files = traces(out);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_NE(files[0].filename().string().find(".2.pt.trace.json"), std::string::npos) << files[0];
  EXPECT_EQ(ranges(files[0], "hasten::optimizer_step"), 1u);

  try {
    acc.profile({.wait = -1, .active = 0, .dir = out.string()});
    FAIL() << "bad counts are refused";
  } catch (const hasten::UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "profile: wait -1, warmup 1, active 0 (allowed: wait and warmup >= 0, active >= 1)");
  }
}

}  // namespace profile_api_tests
