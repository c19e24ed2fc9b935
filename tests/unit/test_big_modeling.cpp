// Big-model inference (hasten/big_modeling.hpp): a model built under EmptyWeights holds no unit
// weights; infer_auto_device_map fills the CPU budget with units in order and sends the rest to
// disk; load_checkpoint_and_dispatch reads the weights by the map, and the model's forward
// (under NoGradGuard) equals the whole model's bit for bit while the disk units hold their
// weights only during their own forward, also when that forward throws. Misuses are one line
// each, refused before any weight is read.
#include <hasten/accelerator.hpp>
#include <hasten/big_modeling.hpp>
#include <hasten/error.hpp>
#include <hasten/safetensors.hpp>
#include <hasten/unit.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "test_util.hpp"

namespace {

constexpr int64_t kWidth = 64, kBlocks = 4;

// An input layer, kBlocks unit blocks, a head; the blocks are what a device map places.
struct StackImpl : torch::nn::Module {
  StackImpl() {
    in = register_module("in", torch::nn::Linear(8, kWidth));
    for (int64_t i = 0; i < kBlocks; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), hasten::Unit<torch::nn::Linear>(kWidth, kWidth)));
    head = register_module("head", torch::nn::Linear(kWidth, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = in(x);
    for (auto& b : blocks) h = torch::relu(b->forward(h));
    return head(h);
  }
  torch::nn::Linear in{nullptr}, head{nullptr};
  std::vector<hasten::Unit<torch::nn::Linear>> blocks;
};
TORCH_MODULE(Stack);

// A unit holding a tensor its parent holds too (tied weights).
struct SharedImpl : torch::nn::Module {
  explicit SharedImpl(const torch::Tensor& t) { w = register_parameter("w", t); }
  torch::Tensor forward(const torch::Tensor& x) { return x.matmul(w); }
  torch::Tensor w;
};
TORCH_MODULE(Shared);
struct TiedModelImpl : torch::nn::Module {
  explicit TiedModelImpl(const torch::Tensor& t) {
    shared = register_parameter("shared", t);
    unit = register_module("unit", hasten::Unit<Shared>(t));
  }
  torch::Tensor shared;
  hasten::Unit<Shared> unit{nullptr};
};

uint64_t held_bytes(torch::nn::Module& m) {
  uint64_t n = 0;
  for (auto& p : m.parameters()) n += static_cast<uint64_t>(p.numel()) * p.element_size();
  return n;
}

// The whole model's weights in one file, and the model.
Stack saved_model(const std::filesystem::path& file) {
  torch::manual_seed(0);
  Stack whole;
  hasten::NamedTensors tensors;
  for (auto& p : whole->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  hasten::save_safetensors(file.string(), tensors);
  return whole;
}

}  // namespace

TEST(BigModeling, DiskUnitsStreamAndTheForwardEqualsTheWholeModel) {
  hasten::test::TempDir dir;
  Stack whole = saved_model(dir.path() / "model.safetensors");
  Stack big{nullptr};
  {
    hasten::EmptyWeights empty;
    big = Stack();
  }
  for (auto& b : big->blocks) ASSERT_EQ(b->weight.numel(), 0) << "a unit built under EmptyWeights kept its weights";
  ASSERT_EQ(big->in->weight.numel(), 8 * kWidth) << "parameters outside units are built whole";

  const uint64_t unit_bytes = (kWidth * kWidth + kWidth) * 4, root_bytes = ((8 + 1) * kWidth + (kWidth + 1) * 4) * 4;
  // Built empty, the units are sized by the shapes they were declared with.
  const auto map = hasten::infer_auto_device_map(*big, {{"cpu", root_bytes + 2 * unit_bytes + 100}});
  ASSERT_EQ(map.size(), 1u + kBlocks);
  EXPECT_EQ(map[0].module, "");
  EXPECT_EQ(map[0].device, "cpu");
  for (int64_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(map[static_cast<size_t>(1 + i)].module, "block" + std::to_string(i));
    EXPECT_EQ(map[static_cast<size_t>(1 + i)].device, i < 2 ? "cpu" : "disk");
  }
  hasten::load_checkpoint_and_dispatch(*big, dir.path().string(), map);  // the directory's model.safetensors
  // Held now: the root's parameters and the two CPU units; the disk units none.
  EXPECT_EQ(held_bytes(*big), root_bytes + 2 * unit_bytes);
  EXPECT_TRUE(torch::equal(big->blocks[1]->weight, whole->blocks[1]->weight));
  EXPECT_EQ(big->blocks[3]->weight.numel(), 0);

  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({5, 8});
  torch::NoGradGuard no_grad;
  const torch::Tensor want = whole->forward(x);
  const torch::Tensor got = big->forward(x);
  EXPECT_TRUE(torch::equal(got, want)) << "the dispatched model's forward differs from the whole model's";
  EXPECT_EQ(held_bytes(*big), root_bytes + 2 * unit_bytes) << "a disk unit kept its weights after its forward";
  EXPECT_TRUE(torch::equal(big->forward(x), want)) << "a second forward differs";
}

TEST(BigModeling, MisusesAreOneLine) {
  hasten::test::TempDir dir;
  const auto file = dir.path() / "model.safetensors";
  Stack whole = saved_model(file);
  auto fresh = [] {
    torch::manual_seed(2);
    return Stack();
  };
  const hasten::DeviceMap disk_tail{{"", "cpu"}, {"block3", "disk"}};
  {
    Stack m = fresh();
    hasten::load_checkpoint_and_dispatch(*m, file.string(), disk_tail);
    const std::string e = hasten::test::error_of([&] { m->forward(torch::ones({1, 8})); });
    EXPECT_NE(e.find("run the forward under torch::NoGradGuard"), std::string::npos) << e;
  }
  auto refused = [&](const hasten::DeviceMap& map, const std::string& expect, const std::string& path = "") {
    Stack m = fresh();
    const std::string e = hasten::test::error_of([&] { hasten::load_checkpoint_and_dispatch(*m, path.empty() ? file.string() : path, map); });
    EXPECT_NE(e.find(expect), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  };
  // A GPU this machine lacks (GPUs are placed by tests/integration/ranks/test_gpu.cpp).
  const int gpus = static_cast<int>(torch::cuda::device_count());
  refused({{"", "cuda:" + std::to_string(gpus)}}, "': this machine has " + (gpus == 0 ? std::string("no CUDA GPU") : std::to_string(gpus)));
  for (const char* bad : {"gpu", "cuda:", "cuda:01", "cuda:x", "cuda:-1", "CUDA:0", "cuda:1234"})
    refused({{"", bad}}, "'" + std::string(bad) + "' is not a device (allowed: cpu, disk, cuda, cuda:N)");
  refused({{"", "cpu"}, {"in", "disk"}}, "'in' is mapped to disk but is not a hasten::Unit");
  refused({{"", "cpu"}, {"block9", "disk"}}, "names 'block9', which the model does not have");
  refused({{"block0", "cpu"}}, "no module of the device map holds 'in.weight'");
  // A checkpoint without the head's bias, and one with a tensor the model lacks.
  hasten::NamedTensors partial, extra;
  for (auto& p : whole->named_parameters()) {
    if (p.key() != "head.bias") partial.emplace_back(p.key(), p.value().detach());
    extra.emplace_back(p.key(), p.value().detach());
  }
  extra.emplace_back("stray", torch::zeros({1}));
  hasten::save_safetensors((dir.path() / "partial.safetensors").string(), partial);
  hasten::save_safetensors((dir.path() / "extra.safetensors").string(), extra);
  refused(disk_tail, "has no 'head.bias', which the model has", (dir.path() / "partial.safetensors").string());
  refused(disk_tail, "has 'stray', which the model does not", (dir.path() / "extra.safetensors").string());
  refused({{"", "cpu"}, {"block3", "disk"}, {"block3", "cpu"}}, "lists 'block3' twice");
  const std::string e = hasten::test::error_of([&] { hasten::infer_auto_device_map(*Stack(), {{"cuda:" + std::to_string(gpus), 1}}); });
  EXPECT_NE(e.find("infer_auto_device_map: device 'cuda:" + std::to_string(gpus) + "': this machine has"), std::string::npos) << e;
  const std::string disk = hasten::test::error_of([] { hasten::infer_auto_device_map(*Stack(), {{"disk", 1}}); });
  EXPECT_NE(disk.find("'disk' is not a device (allowed: cpu, cuda, cuda:N)"), std::string::npos) << disk;
  {  // a refusal reads nothing: the model keeps its own weights
    Stack m = fresh();
    const torch::Tensor before = m->in->weight.clone();
    (void)hasten::test::error_of([&] { hasten::load_checkpoint_and_dispatch(*m, (dir.path() / "extra.safetensors").string(), disk_tail); });
    EXPECT_TRUE(torch::equal(m->in->weight, before)) << "a refused dispatch changed the model";
  }
  {  // dispatched once: dispatching again and preparing it are refused
    Stack m = fresh();
    hasten::load_checkpoint_and_dispatch(*m, file.string(), disk_tail);
    const std::string again = hasten::test::error_of([&] { hasten::load_checkpoint_and_dispatch(*m, file.string(), disk_tail); });
    EXPECT_NE(again.find("'block3' is prepared by an Accelerator or dispatched already"), std::string::npos) << again;
    hasten::Accelerator acc;
    const std::string prepared = hasten::test::error_of([&] { auto pm = acc.prepare(m); });
    EXPECT_NE(prepared.find("is dispatched by a device map"), std::string::npos) << prepared;
  }
}

// A unit whose forward throws lets its weights go; a tensor tied across a disk unit and a CPU
// module is refused.
TEST(BigModeling, AThrowingForwardDropsTheWeightsAndTiedWeightsAreRefused) {
  hasten::test::TempDir dir;
  const auto file = dir.path() / "model.safetensors";
  saved_model(file);
  torch::manual_seed(3);
  Stack m;
  hasten::load_checkpoint_and_dispatch(*m, file.string(), {{"", "cpu"}, {"block2", "disk"}});
  torch::NoGradGuard no_grad;
  EXPECT_THROW(m->blocks[2]->forward(torch::ones({1, kWidth + 1})), c10::Error);  // a shape error inside
  EXPECT_EQ(m->blocks[2]->weight.numel(), 0) << "the weights read for a forward that threw stayed in memory";
  EXPECT_EQ(m->blocks[2]->forward(torch::ones({1, kWidth})).size(1), kWidth);

  // Tied: the root's `shared` is the unit's `w`, one tensor under two names.
  auto shared = torch::randn({kWidth, kWidth});
  auto tied = std::make_shared<TiedModelImpl>(shared);
  hasten::NamedTensors tensors;
  for (auto& p : tied->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  ASSERT_EQ(tensors.size(), 2u);
  const auto tied_file = (dir.path() / "tied.safetensors").string();
  hasten::save_safetensors(tied_file, tensors);
  const std::string e = hasten::test::error_of([&] { hasten::load_checkpoint_and_dispatch(*tied, tied_file, {{"", "cpu"}, {"unit", "disk"}}); });
  EXPECT_NE(e.find("'shared' and 'unit.w' are one tensor (tied weights)"), std::string::npos) << e;
  // Both on the CPU: read once, still one tensor.
  hasten::load_checkpoint_and_dispatch(*tied, tied_file, {{"", "cpu"}});
  EXPECT_EQ(tied->shared.unsafeGetTensorImpl(), tied->unit->w.unsafeGetTensorImpl());
  EXPECT_TRUE(torch::equal(tied->unit->w, shared));
}
