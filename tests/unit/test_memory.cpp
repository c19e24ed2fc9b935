// hasten/memory.hpp: find_executable_batch_size halves the batch after a real out-of-memory
// error (LibTorch's CPU allocator refusing a 2^46-byte buffer, raised inside a prepared model's
// forward and so wrapped by the engine), lets other errors through, and gives up at zero;
// release_memory empties the handles it is given.
#include <hasten/hasten.hpp>
#include <hasten/memory.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <vector>

#include "test_util.hpp"

namespace memory_tests {

// Its forward asks for a scratch buffer of batch << 40 bytes above 16 samples: no machine has
// it, so the allocation fails at once (nothing is touched).
struct HungryImpl : torch::nn::Module {
  HungryImpl() { fc = register_module("fc", torch::nn::Linear(6, 3)); }
  torch::Tensor forward(torch::Tensor x) {
    if (x.size(0) > 16) {
      auto scratch = torch::empty({x.size(0) << 40}, torch::kByte);
      x = x + scratch.numel();
    }
    return fc(x);
  }
  torch::nn::Linear fc{nullptr};
};

int64_t train_once(int64_t batch_size) {
  hasten::test::isolate_home();
  hasten::Accelerator acc;  // one per attempt, as Accelerate's examples make theirs
  auto model = std::make_shared<HungryImpl>();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  auto [net, opt] = acc.prepare(model, sgd);
  acc.backward(net(torch::randn({batch_size, 6})).sum());
  opt.step();
  return batch_size;
}

}  // namespace memory_tests

TEST(Memory, FindExecutableBatchSizeHalvesAfterAnOutOfMemoryError) {
  std::vector<int64_t> tried;
  const int64_t used = hasten::find_executable_batch_size(
      [&](int64_t batch_size) {
        tried.push_back(batch_size);
        return memory_tests::train_once(batch_size);
      },
      128);
  EXPECT_EQ(used, 16);
  EXPECT_EQ(tried, (std::vector<int64_t>{128, 64, 32, 16}));
}

TEST(Memory, FindExecutableBatchSizeLetsOtherErrorsThroughAndStopsAtZero) {
  int calls = 0;
  EXPECT_THROW(hasten::find_executable_batch_size(
                   [&](int64_t) -> int {
                     ++calls;
                     throw std::invalid_argument("not a memory problem");
                   },
                   64),
               std::invalid_argument);
  EXPECT_EQ(calls, 1);
  try {
    hasten::find_executable_batch_size([](int64_t) -> int { throw std::bad_alloc(); }, 5);
    FAIL() << "every batch size failed: an error was expected";
  } catch (const hasten::Error& e) {
    EXPECT_NE(std::string(e.what()).find("every one from 5 down to 1 ran out of memory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(hasten::find_executable_batch_size([](int64_t b) { return b; }, 0), hasten::UsageError);
}

TEST(Memory, ReleaseMemoryEmptiesTheHandlesItIsGiven) {
  torch::Tensor t = torch::ones({4});
  auto shared = std::make_shared<torch::nn::LinearImpl>(2, 2);
  torch::nn::Linear holder(2, 2);
  std::vector<torch::Tensor> list = {torch::ones({2}), torch::ones({3})};
  std::optional<torch::Tensor> maybe = torch::ones({1});
  const auto storage = t.storage();  // a second reference: the storage outlives the handle
  hasten::release_memory(t, shared, holder, list, maybe);
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(shared, nullptr);
  EXPECT_TRUE(holder.is_empty());
  EXPECT_TRUE(list.empty());
  EXPECT_FALSE(maybe.has_value());
  EXPECT_EQ(storage.use_count(), 1);
}
