// Sharding units and the zero/fsdp strategies through the public API: misuse gives clear
// errors (never a crash), state dicts, several models, memory reports.
#include <hasten/hasten.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_util.hpp"

using hasten::Accelerator;
using hasten::Options;
namespace F = torch::nn::functional;

namespace {

Options with(const std::string& strategy) {
  hasten::test::isolate_home();
  Options o;
  o.strategy = strategy;
  return o;
}

// Two unit layers; `bypass` calls the second through its base type, as a mistake would.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool bypass) : bypass(bypass) {
    fc1 = register_module("fc1", hasten::Unit<torch::nn::Linear>(8, 16));
    fc2 = register_module("fc2", hasten::Unit<torch::nn::Linear>(16, 4));
    scale = register_parameter("scale", torch::ones({4}));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(fc1(x));
    auto base = std::static_pointer_cast<torch::nn::LinearImpl>(fc2.ptr());
    return (bypass ? base->forward(h) : fc2(h)) * scale;
  }
  hasten::Unit<torch::nn::Linear> fc1{nullptr}, fc2{nullptr};
  torch::Tensor scale;
  bool bypass;
};

}  // namespace

TEST(Units, AreTheirModuleOutsideASharingStrategy) {
  torch::manual_seed(0);
  hasten::Unit<torch::nn::Linear> unit(3, 2);
  torch::manual_seed(0);
  torch::nn::Linear plain(3, 2);
  EXPECT_TRUE(torch::equal(unit->weight, plain->weight));  // same initialisation
  auto x = torch::randn({5, 3});
  EXPECT_TRUE(torch::equal(unit(x), plain(x)));
  torch::nn::Sequential seq(hasten::Unit<torch::nn::Linear>(3, 3), torch::nn::ReLU());  // AnyModule accepts units
  EXPECT_EQ(seq->forward(x).sizes(), x.sizes());
}

TEST(Units, ZeroStage3FreesParametersAtRestAndGathersThemForForward) {
  Options o = with("zero3");
  Accelerator acc(o);
  torch::manual_seed(0);
  auto net = std::make_shared<NetImpl>(false);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, opt] = acc.prepare(net, sgd);
  EXPECT_EQ(net->fc1->weight.numel(), 0) << "stage 3 keeps no full parameters at rest";
  auto x = torch::randn({4, 8});
  for (int i = 0; i < 3; ++i) {
    acc.backward(model(x).pow(2).mean());
    opt.step();
    opt.zero_grad();
  }
  const auto report = acc.memory_report();
  EXPECT_EQ(report.params, 0u);
  EXPECT_GT(report.param_shards, 0u);
  // The full state dict gathers every unit; the model is back to sharded afterwards.
  auto state = acc.get_state_dict(model);
  ASSERT_EQ(state.size(), 5u);
  for (auto& [name, t] : state) EXPECT_GT(t.numel(), 0) << name;
  EXPECT_EQ(net->fc2->weight.numel(), 0);
}

TEST(Units, ACallThroughABasePointerIsAClearError) {
  Accelerator acc(with("zero3"));
  auto net = std::make_shared<NetImpl>(true);
  auto model = acc.prepare(net);
  try {
    model(torch::randn({4, 8}));
    FAIL() << "a bypassed unit must not run on freed parameters";
  } catch (const hasten::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("call it through its Unit type"), std::string::npos) << e.what();
  }
}

TEST(Units, AModelMovedAfterPrepareIsAClearError) {
  Accelerator acc(with("zero2"));
  auto net = std::make_shared<NetImpl>(false);
  auto model = acc.prepare(net);
  net->to(torch::kDouble);
  try {
    model(torch::randn({4, 8}, torch::kDouble));
    FAIL() << "a moved model must be refused";
  } catch (const hasten::PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("the model was moved"), std::string::npos) << e.what();
  }
}

TEST(Units, SeveralModelsAndShardedStateDictsCoverEveryParameter) {
  hasten::test::TempDir dir;
  hasten::LaunchOptions lo;
  lo.num_processes = 2;
  lo.env["HASTEN_HOME"] = dir.path().string();
  hasten::launch(
      [] {
        Options o;
        o.strategy = "zero3";
        Accelerator acc(o);
        torch::manual_seed(0);
        auto a = std::make_shared<NetImpl>(false);
        auto b = std::make_shared<NetImpl>(false);
        torch::optim::Adam adam(a->parameters(), torch::optim::AdamOptions(1e-2));
        torch::optim::SGD sgd(b->parameters(), torch::optim::SGDOptions(1e-2));
        auto [ma, mb, oa, ob] = acc.prepare(a, b, adam, sgd);
        auto x = torch::randn({4, 8});
        for (int i = 0; i < 2; ++i) {
          acc.backward(ma(x).pow(2).mean() + mb(x).abs().mean());
          oa.step();
          ob.step();
          oa.zero_grad();
          ob.zero_grad();
        }
        // The pieces of all ranks' sharded state dicts rebuild the full one exactly.
        auto full = acc.get_state_dict(ma);
        auto pieces = acc.get_sharded_state_dict(ma);
        int64_t mine = 0;
        for (auto& [name, t] : pieces) mine += t.numel();
        const int64_t total = acc.reduce(torch::tensor({mine}), "sum").item<int64_t>();
        if (total != 8 * 16 + 16 + 16 * 4 + 4 + 4) throw std::runtime_error("shards cover " + std::to_string(total));
        auto gathered = acc.gather(torch::cat([&] {
          std::vector<torch::Tensor> flat;
          for (auto& [name, t] : pieces) flat.push_back(t.reshape(-1));
          return flat;
        }()));
        if (acc.is_main_process()) {
          double sum_full = 0;
          for (auto& [name, t] : full) sum_full += t.sum().item<double>();
          if (std::abs(sum_full - gathered.sum().item<double>()) > 1e-4)
            throw std::runtime_error("sharded pieces do not add up to the full state dict");
        }
      },
      lo);
}

namespace {
// A user module that is a unit, holding a Sequential that is a unit too.
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    inner = register_module("inner", hasten::Unit<torch::nn::Sequential>(torch::nn::Linear(8, 8), torch::nn::Tanh()));
    gate = register_parameter("gate", torch::full({8}, 0.5));
  }
  torch::Tensor forward(torch::Tensor x) { return inner->forward(x) * gate + x; }
  hasten::Unit<torch::nn::Sequential> inner{nullptr};
  torch::Tensor gate;
};
TORCH_MODULE(Block);

struct StackImpl : torch::nn::Module {
  StackImpl() {
    b1 = register_module("b1", hasten::Unit<Block>());
    b2 = register_module("b2", hasten::Unit<Block>());
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return head(b2(b1(x))); }
  hasten::Unit<Block> b1{nullptr}, b2{nullptr};
  torch::nn::Linear head{nullptr};
};

std::vector<double> train_stack(const std::string& strategy, bool sharded_init = false) {
  Options o = with(strategy);
  if (sharded_init) o.set = {{"sharded_init", "true"}};
  Accelerator acc(o);
  torch::manual_seed(3);
  auto net = std::make_shared<StackImpl>();
  if (sharded_init) {  // built sharded: the units' parameters hold nothing, the root's are whole
    EXPECT_EQ(net->b1->gate.numel(), 0);
    EXPECT_EQ(net->b2->inner->parameters().at(0).numel(), 0);
    EXPECT_EQ(net->head->weight.numel(), 8 * 3);
  }
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2));
  auto [model, opt] = acc.prepare(net, adamw);
  torch::manual_seed(4);
  auto x = torch::randn({16, 8});
  auto y = torch::randint(0, 3, {16}, torch::kLong);
  std::vector<double> losses;
  for (int i = 0; i < 5; ++i) {
    auto loss = F::cross_entropy(model(x), y);
    acc.backward(loss);
    opt.step();
    opt.zero_grad();
    losses.push_back(loss.item<double>());
  }
  return losses;
}
}  // namespace

TEST(Units, UserModulesAndSequentialsNestAsUnits) {
  // Nested units (a user module holding a Sequential unit) under every stage train exactly
  // as the unsharded model does.
  const auto reference = train_stack("single");
  for (const std::string s : {"zero1", "zero2", "zero3", "fsdp"}) {
    const auto losses = train_stack(s);
    ASSERT_EQ(losses.size(), reference.size());
    for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], reference[i], 1e-6) << s << " step " << i;
  }
}

namespace {
// Three unit layers of distinct sizes (288, 2112 and 260 parameters) and no parameters of the
// root, so the memory report's figures can be predicted unit by unit.
struct ChainImpl : torch::nn::Module {
  ChainImpl() {
    fc1 = register_module("fc1", hasten::Unit<torch::nn::Linear>(8, 32));
    fc2 = register_module("fc2", hasten::Unit<torch::nn::Linear>(32, 64));
    fc3 = register_module("fc3", hasten::Unit<torch::nn::Linear>(64, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  hasten::Unit<torch::nn::Linear> fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

// Trains a ChainImpl for 3 steps on 2 ranks under `strategy` and `comm` (and the strategy
// options `options`, YAML); rank 0 writes the final parameters (in name order) and its memory
// report to `out`.
void train_chain(const std::string& strategy, const std::string& comm, const std::filesystem::path& out,
                 const std::string& options = "", const std::vector<std::pair<std::string, std::string>>& extra = {}) {
  hasten::test::TempDir home;
  hasten::LaunchOptions lo;
  lo.num_processes = 2;
  lo.env["HASTEN_HOME"] = home.path().string();
  hasten::launch(
      [&] {
        Options o;
        o.strategy = strategy;
        o.set = {{"comm", comm}};
        if (!options.empty()) o.set.emplace_back("strategy_options", options);
        for (auto& kv : extra) o.set.push_back(kv);
        Accelerator acc(o);
        torch::manual_seed(0);
        auto net = std::make_shared<ChainImpl>();
        const int64_t built_numel = net->fc2->weight.numel();  // 0 when built sharded
        torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-2));
        auto [model, opt] = acc.prepare(net, adamw);
        torch::manual_seed(1 + acc.process_index());
        auto x = torch::randn({16, 8});
        for (int i = 0; i < 3; ++i) {
          acc.backward(model(x).pow(2).mean());
          opt.step();
          opt.zero_grad();
        }
        auto state = acc.get_state_dict(model);
        const auto m = acc.memory_report();
        if (acc.is_main_process()) {
          std::vector<torch::Tensor> saved;
          for (auto& [name, t] : state) saved.push_back(t.clone());
          saved.push_back(torch::tensor({static_cast<int64_t>(m.peak_params), static_cast<int64_t>(m.peak_grads),
                                         static_cast<int64_t>(m.grads), built_numel}));
          torch::save(saved, out.string());
        }
      },
      lo);
}
}  // namespace

// fsdp's backward prefetch gathers the next unit while the current one runs backward: worth it
// only where the backend overlaps the gather (gloo works on a thread of its own); shm finishes
// its collectives inside the call, so there fsdp keeps one unit's parameters at a time, as
// zero3 does. Either way the results are those of ddp.
TEST(Units, FsdpPrefetchesOnlyWhereTheBackendOverlapsAndMatchesDdp) {
  hasten::test::TempDir dir;
  const auto path = [&](const std::string& tag) { return dir.path() / (tag + ".pt"); };
  train_chain("ddp", "shm", path("ddp"));
  train_chain("fsdp", "shm", path("fsdp-shm"));
  train_chain("fsdp", "gloo", path("fsdp-gloo"));
  train_chain("zero3", "gloo", path("zero3-gloo"));
  std::map<std::string, std::vector<torch::Tensor>> r;
  for (const char* tag : {"ddp", "fsdp-shm", "fsdp-gloo", "zero3-gloo"}) torch::load(r[tag], path(tag).string());
  const size_t n = r["ddp"].size() - 1;  // the last tensor is the memory report
  for (const char* tag : {"fsdp-shm", "fsdp-gloo", "zero3-gloo"}) {
    ASSERT_EQ(r[tag].size(), n + 1) << tag;
    for (size_t i = 0; i < n; ++i) EXPECT_TRUE(torch::equal(r[tag][i], r["ddp"][i])) << tag << ": parameter " << i;
  }
  const auto report = [&](const char* tag, int field) { return r[tag][n][field].item<int64_t>(); };
  const int64_t fc1 = (8 * 32 + 32) * 4, fc2 = (32 * 64 + 64) * 4, fc3 = (64 * 4 + 4) * 4;
  EXPECT_EQ(report("fsdp-shm", 0), fc2) << "shm: no prefetch, one unit's full parameters at a time";
  EXPECT_EQ(report("fsdp-gloo", 0), fc2 + std::max(fc1, fc3)) << "gloo: the next unit gathers during backward";
  EXPECT_EQ(report("zero3-gloo", 0), fc2) << "zero3 never prefetches";
  // Gradients under shm: at rest this rank's shards (half of every unit); at the peak those plus
  // the full gradients of one unit and their reduce-scatter output, never a second unit's.
  const int64_t shards = report("fsdp-shm", 2);
  EXPECT_EQ(shards, (fc1 + fc2 + fc3) / 2);
  EXPECT_EQ(report("fsdp-shm", 1), shards + fc2 + fc2 / 2);
}

// fsdp's forward_prefetch gathers the unit that ran next in the last forward while the current
// one computes: with backward prefetch off, the peak of full parameters is then two units
// (fc1 with fc2, fc2 with fc3) instead of one, and the weights are still those of ddp.
TEST(Units, FsdpForwardPrefetchGathersTheNextUnitAndMatchesDdp) {
  hasten::test::TempDir dir;
  const auto path = [&](const std::string& tag) { return dir.path() / (tag + ".pt"); };
  train_chain("ddp", "shm", path("ddp"));
  train_chain("fsdp", "gloo", path("off"), "{backward_prefetch: NO_PREFETCH}");
  train_chain("fsdp", "gloo", path("on"), "{backward_prefetch: NO_PREFETCH, forward_prefetch: true}");
  std::map<std::string, std::vector<torch::Tensor>> r;
  for (const char* tag : {"ddp", "off", "on"}) torch::load(r[tag], path(tag).string());
  const size_t n = r["ddp"].size() - 1;
  for (const char* tag : {"off", "on"}) {
    ASSERT_EQ(r[tag].size(), n + 1) << tag;
    for (size_t i = 0; i < n; ++i) EXPECT_TRUE(torch::equal(r[tag][i], r["ddp"][i])) << tag << ": parameter " << i;
  }
  const int64_t fc1 = (8 * 32 + 32) * 4, fc2 = (32 * 64 + 64) * 4, fc3 = (64 * 4 + 4) * 4;
  EXPECT_EQ(r["off"][n][0].item<int64_t>(), fc2) << "no prefetch: one unit's full parameters at a time";
  EXPECT_EQ(r["on"][n][0].item<int64_t>(), fc2 + std::max(fc1, fc3)) << "forward prefetch: the next unit too";
}

// Activation checkpointing under every strategy: each unit's forward runs again in backward
// (a sharding strategy gathers the unit's parameters for the recompute as for the forward,
// FSDP's fsdp_activation_checkpointing turns it on too), and the weights end bitwise those of
// the run without it.
TEST(Units, ActivationCheckpointingEndsWithTheSameWeightsUnderEveryStrategy) {
  hasten::test::TempDir dir;
  for (const std::string s : {"ddp", "zero1", "zero2", "zero3", "fsdp"}) {
    const auto plain = dir.path() / (s + "-plain.pt"), ckpt = dir.path() / (s + "-ckpt.pt");
    train_chain(s, "shm", plain);
    if (s == "fsdp")
      train_chain(s, "shm", ckpt, "", {{"fsdp_config.fsdp_activation_checkpointing", "true"}});
    else
      train_chain(s, "shm", ckpt, "", {{"activation_checkpointing", "true"}});
    std::vector<torch::Tensor> a, b;
    torch::load(a, plain.string());
    torch::load(b, ckpt.string());
    ASSERT_EQ(a.size(), b.size()) << s;
    for (size_t i = 0; i + 1 < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << s << ": parameter " << i;
  }
}

// Models built without their full weights (sharded_init; DeepSpeed's zero3_init_flag and FSDP's
// fsdp_cpu_ram_efficient_loading set it): each unit keeps only this rank's shard once built,
// and the run then trains bitwise as the model built whole.
TEST(Units, ShardedInitBuildsEachUnitShardedAndTrainsAsTheWholeModel) {
  hasten::test::TempDir dir;
  const auto path = [&](const std::string& tag) { return dir.path() / (tag + ".pt"); };
  train_chain("ddp", "shm", path("ddp"));
  train_chain("zero3", "shm", path("zero3"));
  train_chain("zero3", "shm", path("zero3-init"), "", {{"deepspeed_config.zero3_init_flag", "true"}});
  train_chain("zero3", "gloo", path("zero3-init-gloo"), "", {{"sharded_init", "true"}});
  train_chain("fsdp", "shm", path("fsdp-init"), "", {{"fsdp_config.fsdp_cpu_ram_efficient_loading", "true"}});
  // Below stage 3 parameters are whole at rest: units are built whole (with a warning).
  train_chain("zero2", "shm", path("zero2-init"), "", {{"deepspeed_config.zero3_init_flag", "true"}});
  std::map<std::string, std::vector<torch::Tensor>> r;
  for (const char* tag : {"ddp", "zero3", "zero3-init", "zero3-init-gloo", "fsdp-init", "zero2-init"})
    torch::load(r[tag], path(tag).string());
  const size_t n = r["ddp"].size() - 1;
  for (const char* tag : {"zero3", "zero3-init", "zero3-init-gloo", "fsdp-init", "zero2-init"}) {
    ASSERT_EQ(r[tag].size(), n + 1) << tag;
    for (size_t i = 0; i < n; ++i) EXPECT_TRUE(torch::equal(r[tag][i], r["ddp"][i])) << tag << ": parameter " << i;
  }
  const auto built_numel = [&](const char* tag) { return r[tag][n][3].item<int64_t>(); };
  EXPECT_EQ(built_numel("zero3"), 32 * 64);
  EXPECT_EQ(built_numel("zero2-init"), 32 * 64);
  for (const char* tag : {"zero3-init", "zero3-init-gloo", "fsdp-init"}) EXPECT_EQ(built_numel(tag), 0) << tag;
  // Peaks of full parameters are the same: one unit gathered at a time.
  EXPECT_EQ(r["zero3-init"][n][0].item<int64_t>(), r["zero3"][n][0].item<int64_t>());
}

// Nested units (a unit inside a unit) and parameters no unit owns (the root's head, built
// whole) on one process: the same losses as the model built whole.
TEST(Units, ShardedInitKeepsNestedUnitsAndRootParameters) {
  const auto reference = train_stack("single");
  const auto losses = train_stack("zero3", /*sharded_init=*/true);
  ASSERT_EQ(losses.size(), reference.size());
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_EQ(losses[i], train_stack("zero3")[i]) << "step " << i;
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], reference[i], 1e-6) << "step " << i;
}

namespace {
// A unit whose parameter is one an earlier unit already owns (a weight shared by two units).
struct ScaleImpl : torch::nn::Module {
  explicit ScaleImpl(torch::Tensor w) { weight = register_parameter("weight", std::move(w)); }
  torch::Tensor forward(torch::Tensor x) { return x * weight; }
  torch::Tensor weight;
};
TORCH_MODULE(Scale);
struct TiedImpl : torch::nn::Module {
  TiedImpl() {
    a = register_module("a", hasten::Unit<torch::nn::Linear>(4, 4));
    scale = register_module("scale", hasten::Unit<Scale>(a->bias));
  }
  hasten::Unit<torch::nn::Linear> a{nullptr};
  hasten::Unit<Scale> scale{nullptr};
};
}  // namespace

TEST(Units, ShardedInitRefusesAWeightSharedAcrossUnitsInOneLine) {
  Options o = with("zero3");
  o.set = {{"sharded_init", "true"}};
  Accelerator acc(o);
  try {
    auto net = std::make_shared<TiedImpl>();
    FAIL() << "expected an error";
  } catch (const hasten::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("build this model whole"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}
