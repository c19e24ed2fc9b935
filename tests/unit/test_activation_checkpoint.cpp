// Activation checkpointing (Accelerator::checkpoint_activations, config key
// activation_checkpointing): a checkpointed unit keeps no activations and runs again in
// backward; losses, gradients and weights are bitwise those of the run without it, dropout
// included (the recompute draws the forward's masks again). Multi-process strategies:
// tests/integration/ranks/test_sharded.cpp.
#include <hasten/hasten.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "test_util.hpp"

namespace checkpoint_activations_tests {

namespace F = torch::nn::functional;

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    fc = register_module("fc", torch::nn::Linear(16, 16));
    drop = register_module("drop", torch::nn::Dropout(0.3));
  }
  torch::Tensor forward(torch::Tensor x) { return x + drop(torch::tanh(fc(x))); }
  torch::nn::Linear fc{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    in = register_module("in", torch::nn::Linear(8, 16));
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("b" + std::to_string(i), hasten::Unit<Block>()));
    out = register_module("out", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = in(x);
    for (auto& b : blocks) x = b(x);
    return out(x);
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  std::vector<hasten::Unit<Block>> blocks;
};
TORCH_MODULE(Net);

struct Run {
  std::vector<double> losses;
  std::vector<torch::Tensor> params, grads;
};

// 4 steps of AdamW; `how`: "" (none), "call" (checkpoint_activations), "config" (the key);
// `precision`: no or bf16 (the recompute runs under the forward's autocast, and leaves no
// bf16 copy of a weight cached past the optimizer step).
Run train(const std::string& how, const std::string& precision) {
  hasten::test::isolate_home();
  hasten::Options o;
  o.mixed_precision = precision;
  if (how == "config") o.set = {{"activation_checkpointing", "true"}};
  hasten::Accelerator acc(o);
  torch::manual_seed(0);
  Net net;
  if (how == "call") {
    EXPECT_EQ(acc.checkpoint_activations(net), 3u);  // the three blocks
  }
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2));
  auto [model, opt] = acc.prepare(net, adamw);
  for (auto& b : net->blocks) EXPECT_EQ(b->hasten_checkpointed(), !how.empty());
  Run r;
  torch::manual_seed(1);
  for (int step = 0; step < 4; ++step) {
    auto x = torch::randn({32, 8});
    auto y = torch::randint(0, 4, {32});
    auto loss = F::cross_entropy(model(x), y);
    acc.backward(loss);
    r.losses.push_back(loss.item<double>());
    if (step == 3)
      for (auto& p : net->parameters()) r.grads.push_back(p.grad().clone());
    opt.step();
    opt.zero_grad();
  }
  for (auto& p : net->parameters()) r.params.push_back(p.detach().clone());
  return r;
}

}  // namespace checkpoint_activations_tests

TEST(ActivationCheckpointing, LossesGradientsAndWeightsAreBitwiseThoseWithoutIt) {
  using checkpoint_activations_tests::train;
  for (const std::string precision : {"no", "bf16"}) {
  const auto plain = train("", precision);
  for (const char* how : {"call", "config"}) {
    const auto ckpt = train(how, precision);
    ASSERT_EQ(ckpt.losses.size(), plain.losses.size());
    for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_EQ(ckpt.losses[i], plain.losses[i]) << how << " " << precision << " step " << i;
    for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_TRUE(torch::equal(ckpt.grads[i], plain.grads[i])) << how << " grad " << i;
    for (size_t i = 0; i < plain.params.size(); ++i) EXPECT_TRUE(torch::equal(ckpt.params[i], plain.params[i])) << how << " param " << i;
  }
  }
}

TEST(ActivationCheckpointing, TheForwardKeepsOnlyTheBlocksInputs) {
  // What autograd keeps after a forward: without checkpointing each block's activations; with
  // it, only the node that recomputes them. Counted as the graph's nodes reachable from the output.
  hasten::test::isolate_home();
  auto count_nodes = [](const torch::Tensor& t) {
    std::vector<torch::autograd::Node*> stack{t.grad_fn().get()}, seen;
    while (!stack.empty()) {
      auto* n = stack.back();
      stack.pop_back();
      if (n == nullptr || std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
      seen.push_back(n);
      for (auto& e : n->next_edges()) stack.push_back(e.function.get());
    }
    return seen.size();
  };
  torch::manual_seed(0);
  checkpoint_activations_tests::Net plain_net, ckpt_net;
  hasten::Accelerator acc;
  acc.checkpoint_activations(ckpt_net);
  const auto x = torch::randn({4, 8});
  const size_t plain = count_nodes(plain_net(x)), ckpt = count_nodes(ckpt_net(x));
  EXPECT_LT(ckpt + 6, plain) << "checkpointed graph " << ckpt << " nodes, plain " << plain;
}

TEST(ActivationCheckpointing, AModuleWithoutUnitsIsRefused) {
  hasten::test::isolate_home();
  hasten::Accelerator acc;
  auto plain = std::make_shared<torch::nn::LinearImpl>(2, 2);
  try {
    acc.checkpoint_activations(plain);
    FAIL() << "a module without units was accepted";
  } catch (const hasten::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no hasten::Unit whose forward returns one tensor"), std::string::npos)
        << e.what();
  }
  hasten::Options o;
  o.set = {{"activation_checkpointing", "true"}};
  hasten::Accelerator with_key(o);
  torch::optim::SGD sgd(plain->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THROW(with_key.prepare(plain, sgd), hasten::UsageError);
}
