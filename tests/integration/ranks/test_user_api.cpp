// Natural spellings of the user's API that used to give wrong results without a word: each
// now gives the right result or a clear error, under every strategy where one matters.
#include <hasten/hasten.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "test_util.hpp"

// Named, so that a unity build of this file with others has no clashing helper names.
namespace user_api_tests {

namespace fs = std::filesystem;
using hasten::Accelerator;
using hasten::Options;
namespace F = torch::nn::functional;

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", hasten::Unit<torch::nn::Linear>(6, 16));
    fc2 = register_module("fc2", hasten::Unit<torch::nn::Linear>(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  hasten::Unit<torch::nn::Linear> fc1{nullptr}, fc2{nullptr};
};

hasten::LaunchOptions ranks(int n) { return hasten::test::with_ranks(n); }

// Trains 6 steps on 2 ranks clipping as `how` says, returns the final full parameters
// (written by rank 0) and the norms clip_grad_norm_ returned.
hasten::NamedTensors train_clipped(const std::string& strategy, const std::string& how, const fs::path& dir) {
  const fs::path out = dir / (strategy + "-" + how + ".safetensors");
  hasten::launch(
      [&] {
        Options o;
        o.strategy = strategy;
        Accelerator acc(o);
        torch::manual_seed(3);
        auto net = std::make_shared<NetImpl>();
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.5));
        auto [model, opt] = acc.prepare(net, sgd);
        torch::manual_seed(4 + acc.process_index());
        std::vector<double> norms;
        for (int i = 0; i < 6; ++i) {
          acc.backward(F::cross_entropy(model(torch::randn({8, 6}) * 4), torch::randint(0, 3, {8})));
          if (how == "norm-model") norms.push_back(acc.clip_grad_norm_(model, 0.05));
          if (how == "norm-params") norms.push_back(acc.clip_grad_norm_(net->parameters(), 0.05));
          if (how == "value-model") acc.clip_grad_value_(model, 0.01);
          if (how == "value-params") acc.clip_grad_value_(net->parameters(), 0.01);
          opt.step();
          opt.zero_grad();
        }
        auto full = acc.get_state_dict(model);
        if (acc.is_main_process()) {
          full.emplace_back("norms", torch::tensor(norms.empty() ? std::vector<double>{0} : norms, torch::kDouble));
          hasten::save_safetensors(out.string(), full);
        }
      },
      ranks(2));
  return hasten::load_safetensors(out.string());
}

void expect_equal(const hasten::NamedTensors& a, const hasten::NamedTensors& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::allclose(a[i].second, b[i].second, 1e-6, 1e-7)) << what << ": " << a[i].first;
}

}  // namespace

// Accelerate's spelling clip_grad_norm_(model->parameters(), ...) used to return 0 and clip
// nothing under zero2/zero3 (the gradients live in the shards): now it is the model's clip.
TEST(UserApi, ClipByParameterListIsTheModelsClipUnderEveryStrategy) {
  hasten::test::TempDir dir;
  const auto reference = train_clipped("ddp", "norm-model", dir.path());
  EXPECT_GT(reference.back().second[0].item<double>(), 0.05) << "the clip must matter";
  const auto unclipped = train_clipped("ddp", "none", dir.path());
  EXPECT_FALSE(torch::allclose(unclipped.front().second, reference.front().second));
  const auto by_value = train_clipped("ddp", "value-model", dir.path());
  for (const std::string strategy : {"ddp", "zero2", "zero3", "fsdp"}) {
    expect_equal(train_clipped(strategy, "norm-params", dir.path()), reference, strategy + " norm by parameters");
    auto v = train_clipped(strategy, "value-params", dir.path());
    v.back() = by_value.back();  // no norms to compare
    expect_equal(v, by_value, strategy + " value by parameters");
    auto m = train_clipped(strategy, "value-model", dir.path());
    m.back() = by_value.back();
    expect_equal(m, by_value, strategy + " value by model");
  }
}

TEST(UserApi, APartOfAShardedModelsParametersIsAnError) {
  hasten::launch(
      [] {
        Options o;
        o.strategy = "zero3";
        Accelerator acc(o);
        auto net = std::make_shared<NetImpl>();
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.5));
        auto [model, opt] = acc.prepare(net, sgd);
        acc.backward(model(torch::randn({4, 6})).sum());
        try {
          acc.clip_grad_norm_(net->fc1->parameters(), 1.0);
          throw std::runtime_error("clipping part of a sharded model was accepted");
        } catch (const hasten::UsageError& e) {
          if (std::string(e.what()).find("clip_grad_norm_: these are 2 of the 4 parameters of a model that zero shards") ==
              std::string::npos)
            throw std::runtime_error(std::string("message: ") + e.what());
        }
      },
      ranks(2));
}

// `acc.accumulate(model);` as a statement ended the scope at once: the backward after it was
// neither divided nor kept local. Now backward says so.
TEST(UserApi, ADiscardedAccumulateScopeIsAnErrorAtBackward) {
  hasten::test::isolate_home();
  Options o;
  o.gradient_accumulation_steps = 2;
  Accelerator acc(o);
  auto net = std::make_shared<NetImpl>();
  auto model = acc.prepare(net);
  (void)acc.accumulate(model);  // the mistake (the compiler warns without the cast)
  try {
    acc.backward(model(torch::randn({4, 6})).sum());
    FAIL() << "backward after a discarded accumulate() scope was accepted";
  } catch (const hasten::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("auto scope = acc.accumulate(model);"), std::string::npos) << e.what();
  }
  {
    auto scope = acc.accumulate(model);  // the right spelling
    acc.backward(model(torch::randn({4, 6})).sum());
  }
  acc.backward(model(torch::randn({4, 6})).sum());  // outside any scope after a used one: allowed
}

// tracker_options keyed by the tracker's name reached it only when `trackers` named it the
// same way (not when selected by path), and a misspelt key was dropped without a word.
TEST(UserApi, TrackerOptionsReachATrackerSelectedByPathAndTyposAreErrors) {
  static hasten::test::TempDir logs;
  hasten::test::isolate_home();
  auto error_with = [&](const std::string& options) -> std::string {
    Options o;
    o.logging_dir = logs.path().string();
    o.trackers = std::vector<std::string>{hasten::test::test_plugin("described", "libhasten-tracker-described.so")};
    o.set = {{"tracker_options", options}};
    Accelerator acc(o);
    try {
      acc.init_trackers("p");
    } catch (const hasten::Error& e) {
      return e.what();
    }
    return "";
  };
  // By plugin name, for a tracker given as a path: the options reach it (its description
  // refuses the value, so they did).
  std::string e = error_with("{described: {level: 9}}");
  EXPECT_NE(e.find("described options: level: 9 is out of range (allowed: 0 to 3)"), std::string::npos) << e;
  EXPECT_EQ(error_with("{described: {level: 2}}"), "");
  e = error_with("{descrbed: {level: 2}}");
  EXPECT_NE(e.find("tracker_options: 'descrbed' is not a configured tracker"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'described'?"), std::string::npos) << e;
}

// docs/strategies.md: zero3 holds no full parameters at rest. An evaluation under no_grad
// used to leave one unit gathered until the next training step.
TEST(UserApi, Zero3HoldsNoFullParametersAfterAnEvaluationUnderNoGrad) {
  hasten::test::isolate_home();
  for (const std::string strategy : {"zero3", "fsdp"}) {
    Options o;
    o.strategy = strategy;
    Accelerator acc(o);
    auto net = std::make_shared<NetImpl>();
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    auto [model, opt] = acc.prepare(net, sgd);
    acc.backward(model(torch::randn({4, 6})).sum());
    opt.step();
    opt.zero_grad();
    torch::Tensor out;
    {
      torch::NoGradGuard no_grad;
      out = model(torch::randn({4, 6}));
    }
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{4, 3}));
    EXPECT_EQ(acc.memory_report().params, 0u) << strategy << ": full parameters left gathered after evaluation";
    EXPECT_EQ(net->fc1->weight.numel(), 0) << strategy;
    EXPECT_EQ(net->fc2->weight.numel(), 0) << strategy;
    // Training goes on.
    acc.backward(model(torch::randn({4, 6})).sum());
    opt.step();
  }
}

// gather_for_metrics once on a whole epoch's outputs (concatenated per rank) returned the
// padded duplicates: 12 items for 9 samples on 2 ranks. Now each sample counts once.
TEST(UserApi, GatherForMetricsOfAWholeEpochCountsEverySampleOnce) {
  hasten::launch(
      [] {
        Accelerator acc;
        auto x = torch::arange(9, torch::kFloat).unsqueeze(1);
        hasten::DataLoader data(hasten::TensorDataset(x, torch::arange(9)), {.batch_size = 2, .shuffle = true, .seed = 1});
        auto loader = acc.prepare(data);
        for (int epoch = 0; epoch < 2; ++epoch) {
          std::vector<torch::Tensor> seen;
          for (auto& b : loader) seen.push_back(b.target);
          const auto all = acc.gather_for_metrics(torch::cat(seen));
          const auto sorted = std::get<0>(all.sort());
          if (!torch::equal(sorted, torch::arange(9)))
            throw std::runtime_error("epoch " + std::to_string(epoch) + ": gathered " + std::to_string(all.numel()) +
                                     " items, not the 9 samples once each");
        }
        // A partial epoch cannot be told apart from padding: it comes back as gathered.
        std::vector<torch::Tensor> seen;
        for (auto& b : loader) {
          seen.push_back(b.target);
          break;
        }
        if (acc.gather_for_metrics(torch::cat(seen)).numel() != 4) throw std::runtime_error("a partial epoch was trimmed");
      },
      ranks(2));
}

namespace {
// NetImpl, clonable (full_model copies the module).
struct CloneNetImpl : torch::nn::Cloneable<CloneNetImpl> {
  CloneNetImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", hasten::Unit<torch::nn::Linear>(6, 16));
    fc2 = register_module("fc2", hasten::Unit<torch::nn::Linear>(16, 3));
    register_buffer("calls", torch::zeros({1}));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  hasten::Unit<torch::nn::Linear> fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(CloneNet);

void expect_usage_error(const std::function<void()>& call, const std::string& needle, const std::string& what) {
  try {
    call();
  } catch (const hasten::UsageError& e) {
    if (std::string(e.what()).find(needle) == std::string::npos)
      throw std::runtime_error(what + ": the error does not say '" + needle + "': " + e.what());
    return;
  }
  throw std::runtime_error(what + ": no UsageError");
}
}  // namespace

// unwrap_model under zero3 gave a module whose parameters are freed shards (torch::save of it
// wrote a file LibTorch later crashed on). Now unwrap says so and full_model gives a whole copy
// on every rank, under every strategy.
TEST(UserApi, UnwrapUnderParameterShardingIsRefusedAndFullModelIsWhole) {
  hasten::test::TempDir dir;
  for (const std::string strategy : {"ddp", "zero2", "zero3", "fsdp"}) {
    hasten::launch(
        [&] {
          Options o;
          o.strategy = strategy;
          Accelerator acc(o);
          torch::manual_seed(3);
          CloneNet net;
          torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
          auto [model, opt] = acc.prepare(net, adam);
          torch::manual_seed(4 + acc.process_index());
          for (int i = 0; i < 3; ++i) {
            acc.backward(F::cross_entropy(model(torch::randn({8, 6})), torch::randint(0, 3, {8})));
            opt.step();
            opt.zero_grad();
          }
          const bool frees = strategy == "zero3" || strategy == "fsdp";
          if (frees)
            expect_usage_error([&] { acc.unwrap_model(model); }, "acc.full_model(model)", strategy + " unwrap_model");
          else if (acc.unwrap_model(model).get() != net.get())
            throw std::runtime_error(strategy + ": unwrap_model is not the module given to prepare");
          CloneNet full = acc.full_model(model);
          if (full->fc1->weight.numel() != 6 * 16 || full->fc2->bias.numel() != 3)
            throw std::runtime_error(strategy + ": full_model has a parameter that is not whole");
          // The same weights as the prepared model, on every rank: the copy's outputs are the
          // prepared model's, and its file loads into a fresh module.
          const auto x = torch::randn({5, 6});
          torch::Tensor expected;
          {
            torch::NoGradGuard no_grad;
            expected = model(x);
          }
          const auto file = dir.path() / (strategy + "-" + std::to_string(acc.process_index()) + ".pt");
          torch::save(full, file.string());
          CloneNet loaded;
          torch::load(loaded, file.string());
          torch::NoGradGuard no_grad;
          if (!torch::allclose(loaded(x), expected, 1e-6, 1e-6))
            throw std::runtime_error(strategy + ": the saved full_model does not compute the prepared model's outputs");
          // The copy is not attached: training goes on with the prepared model.
          if (full->fc1->hasten_attached()) throw std::runtime_error(strategy + ": the copy's unit is attached");
        },
        ranks(2));
  }
}

namespace {
// Runs `body` on 2 ranks under `strategy` and bf16 with a prepared NetImpl; it must not throw.
void with_prepared(const std::string& strategy,
                   const std::function<void(Accelerator&, hasten::PreparedModel<std::shared_ptr<NetImpl>>&,
                                            std::shared_ptr<NetImpl>&)>& body) {
  hasten::launch(
      [&] {
        Options o;
        o.strategy = strategy;
        o.mixed_precision = "bf16";
        Accelerator acc(o);
        torch::manual_seed(3);
        auto net = std::make_shared<NetImpl>();
        auto model = acc.prepare(net);
        body(acc, model, net);
      },
      ranks(2));
}
}  // namespace

// model->forward(x) reached the module past the prepared model: under bf16 it silently ran in
// float32 (and past the strategy's events). A backward through such a call is now refused;
// the legitimate shapes of a step (two losses, retain_graph, a penalty on the parameters, a
// frozen reference computed with the module) still run.
TEST(UserApi, ABackwardThroughModelArrowForwardIsRefused) {
  for (const std::string strategy : {"ddp", "zero2", "zero3", "fsdp"}) {
    with_prepared(strategy, [&](Accelerator& acc, auto& model, auto&) {
      const auto x = torch::randn({4, 6});
      expect_usage_error([&] { acc.backward(model->forward(x).sum()); }, "call the prepared model: `model(x)`",
                         strategy + " model->forward");
      // A prepared call afterwards: fine.
      acc.backward(model(x).sum());
      // Two losses from two calls, each backward on its own.
      auto a = model(x).sum(), b = model(x * 2).sum();
      acc.backward(a);
      acc.backward(b);
      // One call, two backwards through the kept graph.
      auto c = model(x).sum();
      acc.backward(c, /*retain_graph=*/true);
      acc.backward(c);
      // A penalty on the parameters next to a prepared call.
      torch::Tensor penalty = torch::zeros({});
      for (auto& p : model.parameters()) penalty = penalty + p.pow(2).sum();
      acc.backward(model(x).sum() + (strategy == "zero3" || strategy == "fsdp" ? torch::zeros({}) : penalty));
    });
  }
}

// Under a sharding strategy an optimizer prepared before its model kept the full parameters,
// unreduced on every rank, without a word. Now prepare says so.
TEST(UserApi, AnOptimizerPreparedBeforeItsModelIsRefusedUnderSharding) {
  hasten::test::isolate_home();
  {
    Options o;
    o.strategy = "zero2";
    Accelerator acc(o);
    auto net = std::make_shared<NetImpl>();
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    expect_usage_error([&] { acc.prepare(sgd); }, "acc.prepare(model, optimizer)", "zero2 optimizer first");
  }
  {
    Options o;
    o.strategy = "zero2";
    Accelerator acc(o);
    auto net = std::make_shared<NetImpl>();
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    auto [model, opt] = acc.prepare(net, sgd);  // together: fine
    acc.backward(model(torch::randn({4, 6})).sum());
    opt.step();
  }
  Accelerator plain;  // unsharded: the optimizer alone is fine
  auto net = std::make_shared<NetImpl>();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  plain.prepare(sgd);
}

// clip_grad_value_(model) under a sharding strategy clipped the shards of every prepared
// optimizer: a GAN's other network too. Now only that model's optimizer.
TEST(UserApi, ClipByValueUnderShardingLeavesOtherModelsAlone) {
  hasten::test::isolate_home();
  Options o;
  o.strategy = "zero2";
  Accelerator acc(o);
  auto g = std::make_shared<NetImpl>(), d = std::make_shared<NetImpl>();
  torch::optim::SGD sg(g->parameters(), torch::optim::SGDOptions(0.1)), sd(d->parameters(), torch::optim::SGDOptions(0.1));
  auto [pg, og, pd, od] = acc.prepare(g, sg, d, sd);
  const auto x = torch::randn({8, 6}) * 10;
  acc.backward(pg(x).pow(2).sum() + pd(x).pow(2).sum());
  acc.clip_grad_value_(pg, 1e-6);
  auto max_grad = [](torch::optim::Optimizer& opt) {
    double m = 0;
    for (auto& group : opt.param_groups())
      for (auto& p : group.params())
        if (p.grad().defined()) m = std::max(m, p.grad().abs().max().item<double>());
    return m;
  };
  EXPECT_LE(max_grad(sg), 1e-6 + 1e-12);
  EXPECT_GT(max_grad(sd), 1e-3) << "clipping one model clipped the other's gradients";
}

namespace {
struct PairImpl : torch::nn::Module {
  PairImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  std::tuple<torch::Tensor, torch::Tensor> forward(torch::Tensor x) {
    auto y = fc(x);
    return {y, y * 2};
  }
  torch::nn::Linear fc{nullptr};
};
}  // namespace

// gather on one process returned the input itself (editing one edited the other), and under
// bf16 only a tensor or a vector of them came back float32, not a tuple.
TEST(UserApi, GatherIsACopyAndTupleOutputsComeBackFloat32) {
  hasten::test::isolate_home();
  Options o;
  o.mixed_precision = "bf16";
  Accelerator acc(o);
  auto t = torch::ones({3});
  auto gathered = acc.gather(t);
  gathered.add_(1);
  EXPECT_TRUE(torch::equal(t, torch::ones({3}))) << "gather's result shares the input's memory";
  auto model = acc.prepare(std::make_shared<PairImpl>());
  auto [a, b] = model(torch::randn({2, 4}));
  EXPECT_EQ(a.scalar_type(), torch::kFloat);
  EXPECT_EQ(b.scalar_type(), torch::kFloat);
}

}  // namespace user_api_tests
