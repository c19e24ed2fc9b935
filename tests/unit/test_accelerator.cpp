// The one-process lifecycle through the public API: prepare, accumulate, backward, the
// prepared optimizer and scheduler, clipping, precision plugins, plugin failures, trackers.
#include <hasten/hasten.hpp>
#include <hasten/torch_compat.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "test_util.hpp"

using hasten::Accelerator;
using hasten::Options;
namespace F = torch::nn::functional;

namespace {

// Options isolated from any user config file and environment settings.
Options isolated(Options o = {}) {
  hasten::test::isolate_home();
  return o;
}

struct Data {
  torch::Tensor x, y;
};

Data make_data(int64_t n) {
  torch::manual_seed(1);
  return {torch::randn({n, 6}), torch::randint(0, 3, {n}, torch::kLong)};
}

std::shared_ptr<torch::nn::LinearImpl> make_model() {
  torch::manual_seed(0);
  return std::make_shared<torch::nn::LinearImpl>(6, 3);
}

// Halves the learning rate on every step() (LibTorch's StepLR skips its first call).
struct Halving : torch::optim::LRScheduler {
  using LRScheduler::LRScheduler;
  std::vector<double> get_lrs() override {
    auto lrs = get_current_lrs();
    for (auto& lr : lrs) lr *= 0.5;
    return lrs;
  }
};

std::vector<torch::Tensor> grads_of(const torch::nn::Module& m) {
  std::vector<torch::Tensor> g;
  for (auto& p : m.parameters()) g.push_back(p.grad().clone());
  return g;
}

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

}  // namespace

TEST(Accumulation, FourMicroBatchesOfEightEqualOneBatchOf32) {
  Data d = make_data(32);
  auto reference = make_model();
  F::cross_entropy(reference->forward(d.x), d.y).backward();
  const auto expected = grads_of(*reference);

  Options o = isolated();
  o.gradient_accumulation_steps = 4;
  Accelerator acc(o);
  auto model = make_model();
  hasten::DataLoader data(hasten::TensorDataset(d.x, d.y), {.batch_size = 8});
  auto [net, loader] = acc.prepare(model, data);
  std::vector<bool> syncs;
  for (auto& batch : loader) {
    auto scope = acc.accumulate(net);
    syncs.push_back(acc.sync_gradients());
    acc.backward(F::cross_entropy(net(batch.input), batch.target));
  }
  EXPECT_EQ(syncs, (std::vector<bool>{false, false, false, true}));
  EXPECT_LT(max_diff(grads_of(*model), expected), 1e-6);
}

TEST(Accumulation, StepAndZeroGradAreNoOpsOnMicroBatches) {
  Data d = make_data(32);
  Options o = isolated();
  o.gradient_accumulation_steps = 4;
  Accelerator acc(o);
  auto model = make_model();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  hasten::DataLoader data(hasten::TensorDataset(d.x, d.y), {.batch_size = 8});
  auto [opt, net, loader] = acc.prepare(sgd, model, data);  // any order
  int i = 0;
  for (auto& batch : loader) {
    auto scope = acc.accumulate(net);
    acc.backward(F::cross_entropy(net(batch.input), batch.target));
    const auto before = model->weight.detach().clone();
    const auto grad_before = model->weight.grad().clone();
    opt.step();
    opt.zero_grad();
    if (++i < 4) {
      EXPECT_TRUE(torch::equal(model->weight, before)) << "step ran on micro-batch " << i;
      EXPECT_TRUE(torch::equal(model->weight.grad(), grad_before)) << "zero_grad ran on micro-batch " << i;
    } else {
      EXPECT_FALSE(torch::equal(model->weight, before));
      EXPECT_EQ(model->weight.grad().abs().sum().item<double>(), 0.0);
    }
  }
  EXPECT_EQ(i, 4);
}

TEST(Accumulation, TheLoadersLastBatchSyncsAndAShortWindowIsAMean) {
  // 6 batches, windows of 4: sync on the 4th and on the 6th (the loader's last); the last
  // window has 2 micro-batches, so its gradient is their mean, not their sum over 4.
  Data d = make_data(12);
  Options o = isolated();
  o.gradient_accumulation_steps = 4;
  Accelerator acc(o);
  auto model = make_model();
  hasten::DataLoader data(hasten::TensorDataset(d.x, d.y), {.batch_size = 2});
  auto [net, loader] = acc.prepare(model, data);
  std::vector<bool> syncs;
  int b = 0;
  for (auto& batch : loader) {
    auto scope = acc.accumulate(net);
    syncs.push_back(acc.sync_gradients());
    if (b == 4) model->zero_grad();  // look at the last window alone
    acc.backward(F::cross_entropy(net(batch.input), batch.target));
    ++b;
  }
  EXPECT_EQ(syncs, (std::vector<bool>{false, false, false, true, false, true}));
  auto reference = make_model();
  F::cross_entropy(reference->forward(d.x.narrow(0, 8, 4)), d.y.narrow(0, 8, 4)).backward();
  EXPECT_LT(max_diff(grads_of(*model), grads_of(*reference)), 1e-6);
}

TEST(Accumulation, BackwardOutsideAccumulateDoesNotDivide) {
  Data d = make_data(8);
  Options o = isolated();
  o.gradient_accumulation_steps = 4;
  Accelerator acc(o);
  auto model = make_model();
  auto net = acc.prepare(model);
  acc.backward(F::cross_entropy(net(d.x), d.y));
  auto reference = make_model();
  F::cross_entropy(reference->forward(d.x), d.y).backward();
  EXPECT_LT(max_diff(grads_of(*model), grads_of(*reference)), 1e-7);
}

TEST(Scheduler, StepsOncePerOptimizerStep) {
  Data d = make_data(64);
  Options o = isolated();
  o.gradient_accumulation_steps = 4;
  Accelerator acc(o);
  auto model = make_model();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1.0));
  Halving step_lr(sgd);
  hasten::DataLoader data(hasten::TensorDataset(d.x, d.y), {.batch_size = 8});
  auto [net, opt, sched, loader] = acc.prepare(model, sgd, step_lr, data);
  for (auto& batch : loader) {  // 8 micro-batches: 2 optimizer steps
    auto scope = acc.accumulate(net);
    acc.backward(F::cross_entropy(net(batch.input), batch.target));
    opt.step();
    sched.step();
    opt.zero_grad();
  }
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.25);
}

TEST(Scheduler, DoesNotStepWhenTheOptimizerStepWasSkipped) {
  Data d = make_data(8);
  Options o = isolated();
  o.precision = "fp16";
  o.set = {{"precision_options", "{cpu_scaler_only: true}"}};
  Accelerator acc(o);
  auto model = make_model();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1.0));
  Halving step_lr(sgd);
  auto [net, opt, sched] = acc.prepare(model, sgd, step_lr);
  acc.backward(F::cross_entropy(net(d.x), d.y));
  model->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  opt.step();
  sched.step();
  EXPECT_TRUE(opt.step_was_skipped());
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 1.0);
  opt.zero_grad();
  acc.backward(F::cross_entropy(net(d.x), d.y));
  opt.step();
  sched.step();
  EXPECT_FALSE(opt.step_was_skipped());
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.5);
}

TEST(Clipping, ReturnsTheTotalNormAndClips) {
  Data d = make_data(16);
  Accelerator acc(isolated());
  auto model = make_model();
  auto net = acc.prepare(model);
  acc.backward(F::cross_entropy(net(d.x), d.y) * 100.0);
  double expected = 0;
  for (auto& p : model->parameters()) expected += p.grad().pow(2).sum().item<double>();
  expected = std::sqrt(expected);
  const double total = acc.clip_grad_norm_(net, 0.5);
  EXPECT_NEAR(total, expected, 1e-4 * expected);
  double after = 0;
  for (auto& p : model->parameters()) after += p.grad().pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(after), 0.5, 1e-4);
  acc.clip_grad_value_(net, 0.01);
  for (auto& p : model->parameters()) EXPECT_LE(p.grad().abs().max().item<double>(), 0.01 + 1e-9);
}

namespace {
// Records what autocast looks like from inside forward.
struct ProbeImpl : torch::nn::Module {
  ProbeImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(torch::Tensor x) {
    inside_enabled = hasten::compat::autocast_enabled(c10::DeviceType::CPU);
    auto y = fc->forward(x);
    inside_dtype = y.scalar_type();
    return y;
  }
  torch::nn::Linear fc{nullptr};
  bool inside_enabled = false;
  c10::ScalarType inside_dtype = c10::ScalarType::Undefined;
};
}  // namespace

TEST(Precision, Bf16AutocastIsOnInsideForwardAndOffOutside) {
  Options o = isolated();
  o.mixed_precision = "bf16";
  Accelerator acc(o);
  auto probe = std::make_shared<ProbeImpl>();
  auto net = acc.prepare(probe);
  auto out = net(torch::randn({2, 4}));
  EXPECT_TRUE(probe->inside_enabled);
  EXPECT_EQ(probe->inside_dtype, torch::kBFloat16);
  EXPECT_EQ(out.scalar_type(), torch::kFloat);  // outputs come back float32
  EXPECT_FALSE(hasten::compat::autocast_enabled(c10::DeviceType::CPU));
  EXPECT_EQ(probe->fc->weight.scalar_type(), torch::kFloat);  // weights stay float32
  {
    auto scope = acc.autocast();
    EXPECT_TRUE(hasten::compat::autocast_enabled(c10::DeviceType::CPU));
  }
  EXPECT_FALSE(hasten::compat::autocast_enabled(c10::DeviceType::CPU));
  probe->forward(torch::randn({2, 4}));  // the raw module is not autocast
  EXPECT_FALSE(probe->inside_enabled);
}

TEST(Precision, NoPrecisionLeavesForwardInFloat32) {
  Accelerator acc(isolated());
  auto probe = std::make_shared<ProbeImpl>();
  auto net = acc.prepare(probe);
  net(torch::randn({2, 4}));
  EXPECT_FALSE(probe->inside_enabled);
  EXPECT_EQ(probe->inside_dtype, torch::kFloat);
}

TEST(Precision, Fp16OnACpuRunIsAClearError) {
  Options o = isolated();
  o.mixed_precision = "fp16";
  try {
    Accelerator acc(o);
    FAIL() << "fp16 on a CPU-only run must be refused";
  } catch (const hasten::PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("'fp16' needs a CUDA device"), std::string::npos) << e.what();
  }
}

TEST(Precision, Fp16ScalerSkipsBacksOffAndGrows) {
  Data d = make_data(8);
  Options o = isolated();
  o.mixed_precision = "fp16";
  o.set = {{"precision_options", "{cpu_scaler_only: true, init_scale: 1024, growth_interval: 3}"}};
  Accelerator acc(o);
  auto model = make_model();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  auto [net, opt] = acc.prepare(model, sgd);
  EXPECT_DOUBLE_EQ(acc.loss_scale(), 1024.0);

  // Gradients come back unscaled: the same as an unscaled float32 backward.
  auto reference = make_model();
  F::cross_entropy(reference->forward(d.x), d.y).backward();
  acc.backward(F::cross_entropy(net(d.x), d.y));
  EXPECT_GT(model->weight.grad().abs().max().item<double>(), 1.0);  // still scaled
  acc.unscale_gradients();
  EXPECT_LT(max_diff(grads_of(*model), grads_of(*reference)), 1e-6);
  opt.step();  // uses the gradients unscaled above (not unscaled twice)
  EXPECT_FALSE(opt.step_was_skipped());
  opt.zero_grad();

  // A non-finite gradient: the step is skipped and the scale halves.
  acc.backward(F::cross_entropy(net(d.x), d.y));
  model->weight.mutable_grad()[1][2] = std::numeric_limits<float>::quiet_NaN();
  const auto before = model->weight.detach().clone();
  opt.step();
  EXPECT_TRUE(opt.step_was_skipped());
  EXPECT_TRUE(acc.optimizer_step_was_skipped());
  EXPECT_TRUE(torch::equal(model->weight.detach(), before));
  EXPECT_DOUBLE_EQ(acc.loss_scale(), 512.0);
  opt.zero_grad();

  // growth_interval good steps in a row double it.
  for (int i = 0; i < 3; ++i) {
    acc.backward(F::cross_entropy(net(d.x), d.y));
    opt.step();
    EXPECT_FALSE(opt.step_was_skipped());
    opt.zero_grad();
    EXPECT_DOUBLE_EQ(acc.loss_scale(), i < 2 ? 512.0 : 1024.0);
  }
  EXPECT_FALSE(torch::equal(model->weight.detach(), before));
}

// The fp16 loss scaler's scale and growth tracker are in the checkpoint: a run resumed after
// step 3 ends with the weights and the scale of the straight run. (Without them the resumed
// scaler would restart at init_scale with a zero tracker: 1024 right after the load instead of
// 512, and 2048 at the end instead of 1024.)
struct Fp16Run {
  torch::Tensor weight;
  double scale_after_load = 0;
  double final_scale = 0;
};

Fp16Run fp16_run(int steps, int resume_after, const std::filesystem::path& dir) {
  const Data d = make_data(8);
  auto options = [&] {
    Options o = isolated();
    o.mixed_precision = "fp16";
    o.project_dir = dir.string();
    o.set = {{"precision_options", "{cpu_scaler_only: true, init_scale: 1024, growth_interval: 3}"}};
    return o;
  };
  Fp16Run r;
  auto train = [&](int from, int to, bool load) {
    Accelerator acc(options());
    auto model = make_model();
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.05));
    auto [net, opt] = acc.prepare(model, adam);
    if (load) {
      acc.load_state((dir / "ckpt").string());
      r.scale_after_load = acc.loss_scale();
    }
    for (int i = from; i < to; ++i) {
      acc.backward(F::cross_entropy(net(d.x), d.y));
      if (i == 1) model->weight.mutable_grad()[0][0] = std::numeric_limits<float>::quiet_NaN();  // skipped; halves
      opt.step();
      opt.zero_grad();
    }
    if (to < steps) acc.save_state((dir / "ckpt").string());
    r.weight = model->weight.detach().clone();
    r.final_scale = acc.loss_scale();
  };
  if (resume_after <= 0) {
    train(0, steps, false);
  } else {
    train(0, resume_after, false);
    train(resume_after, steps, true);
  }
  return r;
}

TEST(Precision, Fp16ScalerStateIsCheckpointedAndAResumedRunEqualsTheStraightOne) {
  hasten::test::TempDir straight_dir, resumed_dir;
  const Fp16Run straight = fp16_run(7, 0, straight_dir.path());
  const Fp16Run resumed = fp16_run(7, 3, resumed_dir.path());
  EXPECT_DOUBLE_EQ(resumed.scale_after_load, 512.0) << "the scale after step 1's skip, not init_scale";
  EXPECT_DOUBLE_EQ(straight.final_scale, 1024.0);
  EXPECT_DOUBLE_EQ(resumed.final_scale, straight.final_scale);
  EXPECT_TRUE(torch::equal(resumed.weight, straight.weight));
}

TEST(Precision, Fp16OptionsAreValidated) {
  Options o = isolated();
  o.mixed_precision = "fp16";
  o.set = {{"precision_options", "{cpu_scaler_only: true, growth_intervall: 3}"}};
  try {
    Accelerator acc(o);
    FAIL();
  } catch (const hasten::PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'growth_intervall'"), std::string::npos) << e.what();
  }
}

TEST(Plugins, AStrategyFromAnotherLibTorchBuildIsRefusedAtConstruction) {
  Options o = isolated();
  o.strategy = hasten::test::test_plugin("broken", "libhasten-strategy-fingerprint_mismatch.so");
  try {
    Accelerator acc(o);
    FAIL();
  } catch (const hasten::PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("built against LibTorch 'torch=0.4.1"), std::string::npos) << e.what();
  }
}

TEST(Plugins, ACreateThatFailsReportsItsOwnMessage) {
  hasten::test::TempDir logs;
  Options o = isolated();
  o.logging_dir = logs.path().string();
  o.trackers = std::vector<std::string>{hasten::test::test_plugin("broken", "libhasten-tracker-create_fails.so")};
  Accelerator acc(o);
  try {
    acc.init_trackers("p");
    FAIL();
  } catch (const hasten::PluginError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tracker plugin 'create_fails'"), std::string::npos) << m;
    EXPECT_NE(m.find("create failed (invalid argument): create failed on purpose: option 'x' is required"),
              std::string::npos)
        << m;
  }
}

TEST(Plugins, DescribedOptionsAreCheckedBeforeCreate) {
  // The described tracker's create() fails if a key outside its description reaches it.
  hasten::test::TempDir logs;
  auto error_with = [&](const std::string& options) -> std::string {
    Options o = isolated();
    o.logging_dir = logs.path().string();
    o.trackers = std::vector<std::string>{"described"};
    o.set = {{"plugin_path", "[" + std::string(HASTEN_TEST_PLUGIN_DIR) + "/described]"},
             {"tracker_options", "{described: " + options + "}"}};
    Accelerator acc(o);
    try {
      acc.init_trackers("p");
    } catch (const hasten::PluginError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_with("{level: 2, mode: exact}"), "");
  std::string m = error_with("{level: 2, unknwon: 1}");
  EXPECT_NE(m.find("described options: unknown key 'unknwon' (allowed: level, mode)"), std::string::npos) << m;
  m = error_with("{level: 9}");
  EXPECT_NE(m.find("described options: level: 9 is out of range (allowed: 0 to 3)"), std::string::npos) << m;
  m = error_with("{mode: exakt}");
  EXPECT_NE(m.find("described options: mode: 'exakt' is not allowed (allowed: fast, exact); did you mean 'exact'?"),
            std::string::npos)
      << m;
  m = error_with("{level: high}");
  EXPECT_NE(m.find("described options: level: expected an integer, got \"high\""), std::string::npos) << m;
}

TEST(Plugins, ThePlainCOptionsHelperReadsEveryTypeAndNamesWhatIsWrong) {
  // tests/plugins/c_options_tracker.c reads its options with hasten/plugin_options.h and
  // describes none, so every check here is the helper's; its create() fails on purpose with
  // what it read.
  hasten::test::TempDir logs;
  auto error_with = [&](const std::string& options) -> std::string {
    Options o = isolated();
    o.logging_dir = logs.path().string();
    o.trackers = std::vector<std::string>{"c_options"};
    o.set = {{"plugin_path", "[" + std::string(HASTEN_TEST_PLUGIN_DIR) + "/c_options]"},
             {"tracker_options", "{c_options: " + options + "}"}};
    Accelerator acc(o);
    try {
      acc.init_trackers("p");
    } catch (const hasten::PluginError& e) {
      return e.what();
    }
    return "";
  };
  std::string m = error_with("{}");
  EXPECT_NE(m.find("read level=1 ratio=0.5 verbose=0 name=none"), std::string::npos) << m;
  m = error_with("{level: 3, ratio: 2, verbose: true, name: abc}");
  EXPECT_NE(m.find("read level=3 ratio=2 verbose=1 name=abc"), std::string::npos) << m;
  m = error_with("{level: high}");
  EXPECT_NE(m.find("create failed (invalid argument): c_options: option level: expected an integer, got \"high\""),
            std::string::npos)
      << m;
  m = error_with("{ratio: x}");
  EXPECT_NE(m.find("c_options: option ratio: expected a number, got \"x\""), std::string::npos) << m;
  m = error_with("{verbose: 1}");
  EXPECT_NE(m.find("c_options: option verbose: expected true or false, got 1"), std::string::npos) << m;
  m = error_with("{name: 3}");
  EXPECT_NE(m.find("c_options: option name: expected a string, got 3"), std::string::npos) << m;
  m = error_with("{levle: 3}");
  EXPECT_NE(m.find("c_options options: unknown key 'levle' (allowed: level, ratio, verbose, name)"), std::string::npos)
      << m;
}

TEST(Plugins, ACreateThatThrowsDoesNotTakeTheHostDown) {
  hasten::test::TempDir logs;
  Options o = isolated();
  o.logging_dir = logs.path().string();
  o.trackers = std::vector<std::string>{hasten::test::test_plugin("broken", "libhasten-tracker-create_throws.so")};
  Accelerator acc(o);
  try {
    acc.init_trackers("p");
    FAIL();
  } catch (const hasten::PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("create threw an exception across the C ABI: create threw on purpose"),
              std::string::npos)
        << e.what();
  }
}

TEST(Plugins, TheHostCallsStrategySlotsWhereTheLifecycleSays) {
  hasten::test::TempDir dir;
  const std::string trace = (dir.path() / "trace.txt").string();
  Options o = isolated();
  o.strategy = hasten::test::test_plugin("tracing", "libhasten-strategy-tracing.so");
  o.gradient_accumulation_steps = 2;
  o.set = {{"strategy_options", "{trace_file: " + trace + "}"}};
  {
    Accelerator acc(o);
    Data d = make_data(16);
    auto model = make_model();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    hasten::DataLoader data(hasten::TensorDataset(d.x, d.y), {.batch_size = 8});
    auto [opt, loader, net] = acc.prepare(sgd, data, model);  // the optimizer comes first here
    for (auto& batch : loader) {
      auto scope = acc.accumulate(net);
      acc.backward(F::cross_entropy(net(batch.input), batch.target));
      opt.step();
      opt.zero_grad();
    }
  }
  std::ifstream in(trace);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(),
            "prepare_model 0 params 2\n"
            "prepare_optimizer\n"
            "set_gradient_sync 0\n"  // micro-batch 1 of 2: no gradient communication
            "before_backward\n"
            "after_backward\n"
            "set_gradient_sync 1\n"  // restored when its accumulate() scope ends
            "before_backward\n"       // micro-batch 2: syncs
            "after_backward\n"
            "before_optimizer_step\n"
            "after_optimizer_step\n");
}

TEST(Trackers, CsvAndJsonlWriteTheirFiles) {
  hasten::test::TempDir logs;
  Options o = isolated();
  o.logging_dir = logs.path().string();
  o.trackers = std::vector<std::string>{"csv", "jsonl"};
  Accelerator acc(o);
  acc.init_trackers("run1", {{"lr", 0.001}, {"model", std::string("mlp")}, {"layers", int64_t{3}}, {"bf16", false}});
  acc.log({{"loss", 2.5}, {"acc", 0.25}}, 1);
  acc.log({{"loss", 1.5}}, 2);
  acc.log({{"zeta", 7.0}, {"loss", 0.1}}, 3);  // a new metric widens the CSV
  acc.log({{"loss", std::nan("")}}, 4);
  acc.end_training();

  EXPECT_EQ(logs.read("run1/metrics.csv"),
            "step,acc,loss,zeta\n"
            "1,0.25,2.5,\n"
            "2,,1.5,\n"
            "3,,0.1,7\n"
            "4,,nan,\n");
  auto hparams = nlohmann::json::parse(logs.read("run1/hparams.json"));
  EXPECT_EQ(hparams.at("model"), "mlp");
  EXPECT_EQ(hparams.at("layers"), 3);

  std::istringstream lines(logs.read("run1/metrics.jsonl"));
  std::vector<nlohmann::json> records;
  std::vector<std::string> raw;
  for (std::string line; std::getline(lines, line);) {
    raw.push_back(line);
    // NaN is written as Python's json module writes it, which nlohmann-json does not read.
    const auto nan = line.find("\"loss\":NaN}");
    records.push_back(nlohmann::json::parse(nan == std::string::npos ? line : line.substr(0, nan) + "\"loss\":\"NaN\"}"));
  }
  ASSERT_EQ(records.size(), 6u);
  EXPECT_EQ(records[0].at("type"), "hparams");
  EXPECT_EQ(records[0].at("hparams").at("lr"), 0.001);
  EXPECT_EQ(records[1].at("step"), 1);
  EXPECT_EQ(records[1].at("loss"), 2.5);
  EXPECT_EQ(records[4].at("loss"), "NaN") << raw[4];  // the bare token NaN
  EXPECT_EQ(records[5].at("type"), "end");
  EXPECT_EQ(records[5].at("status"), "ok");
}

TEST(Trackers, JsonlWritesNonFiniteValuesAsPythonsJsonModuleDoes) {
  // Bare NaN, Infinity and -Infinity: json.loads reads them back as the same floats
  // (test_tracker_crashes.py checks that with Python itself).
  hasten::test::TempDir logs;
  Options o = isolated();
  o.logging_dir = logs.path().string();
  o.trackers = std::vector<std::string>{"jsonl"};
  Accelerator acc(o);
  acc.init_trackers("nonfinite");
  const double inf = std::numeric_limits<double>::infinity();
  acc.log({{"a", std::nan("")}, {"b", inf}, {"c", -inf}, {"d", 0.5}}, 1);
  acc.end_training();
  const std::string text = logs.read("nonfinite/metrics.jsonl");
  EXPECT_NE(text.find(R"("step":1,)"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("a":NaN,"b":Infinity,"c":-Infinity,"d":0.5})"), std::string::npos) << text;
}

TEST(Trackers, LogTextReachesTheTrackersThatKeepText) {
  hasten::test::TempDir logs;
  Options o = isolated();
  o.logging_dir = logs.path().string();
  o.trackers = std::vector<std::string>{"csv", "jsonl"};  // csv keeps no text: it skips it
  Accelerator acc(o);
  acc.init_trackers("run2");
  acc.log_text("sample", "the quick brown fox", 7);
  acc.log({{"loss", 1.0}}, 7);
  acc.end_training();
  std::istringstream lines(logs.read("run2/metrics.jsonl"));
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(lines, line);) records.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(records.size(), 4u);  // hparams, text, metrics, end
  EXPECT_EQ(records[1].at("type"), "text");
  EXPECT_EQ(records[1].at("name"), "sample");
  EXPECT_EQ(records[1].at("text"), "the quick brown fox");
  EXPECT_EQ(records[1].at("step"), 7);
  EXPECT_EQ(logs.read("run2/metrics.csv"), "step,loss\n7,1\n");
}

TEST(Trackers, AnUnknownTrackerIsAnErrorListingTheAvailableOnes) {
  Options o = isolated();
  o.trackers = std::vector<std::string>{"tensorbaord"};
  Accelerator acc(o);
  try {
    acc.init_trackers("p");
    FAIL();
  } catch (const hasten::PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown tracker plugin 'tensorbaord' (available: "), std::string::npos);
  }
}

TEST(Processes, OneProcessMeanings) {
  Accelerator acc(isolated());
  EXPECT_TRUE(acc.is_main_process());
  EXPECT_EQ(acc.num_processes(), 1);
  auto t = torch::arange(6).reshape({3, 2});
  EXPECT_TRUE(torch::equal(acc.gather(t), t));
  EXPECT_EQ(acc.gather(torch::tensor(3.0)).sizes(), torch::IntArrayRef({1}));
  EXPECT_TRUE(torch::equal(acc.reduce(t, "mean"), t));
  EXPECT_TRUE(torch::equal(acc.broadcast(t), t));
  EXPECT_EQ(acc.broadcast(std::string("hello")), "hello");
  EXPECT_TRUE(torch::equal(acc.pad_across_processes(t, 0), t));
  acc.wait_for_everyone();
  { auto first = acc.main_process_first(); }
  EXPECT_EQ(acc.split_between_processes(std::vector<int>{1, 2, 3}), (std::vector<int>{1, 2, 3}));
  EXPECT_FALSE(acc.check_trigger());
  acc.set_trigger();
  EXPECT_TRUE(acc.check_trigger());
  EXPECT_FALSE(acc.check_trigger());
  EXPECT_THROW(acc.reduce(t, "median"), hasten::UsageError);
  EXPECT_THROW(acc.broadcast(t, 1), hasten::UsageError);
}

TEST(Prepare, ReturnsObjectsInOrderAndUnwraps) {
  Accelerator acc(isolated());
  auto a = make_model();
  auto b = std::make_shared<torch::nn::LinearImpl>(3, 2);
  auto sgd = std::make_shared<torch::optim::SGD>(a->parameters(), torch::optim::SGDOptions(0.1));
  auto [pa, po, pb] = acc.prepare(a, sgd, b);
  EXPECT_EQ(acc.unwrap_model(pa).get(), a.get());
  EXPECT_EQ(acc.unwrap_model(pb).get(), b.get());
  EXPECT_EQ(&po.optimizer(), sgd.get());
  EXPECT_EQ(pa.index(), 0u);
  EXPECT_EQ(pb.index(), 1u);
  auto x = torch::randn({2, 6});
  EXPECT_TRUE(torch::allclose(pb(pa(x)), b->forward(a->forward(x))));
  // A holder type works too.
  torch::nn::Linear holder(2, 2);
  auto ph = acc.prepare(holder);
  EXPECT_EQ(ph->weight.size(0), 2);
}

// register_save_state_pre_hook / register_load_state_pre_hook: a hook that saves the model its
// own way into the staging directory (its file is part of the checkpoint) and takes it out of
// the list, so hasten writes no weights of it; the load hook reads it back its own way; a
// removed hook runs no more.
TEST(Checkpoints, PreHooksSaveAndLoadAModelTheirOwnWay) {
  hasten::test::TempDir dir;
  const Data d = make_data(8);
  Accelerator acc(isolated());
  auto model = make_model();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  auto [net, opt] = acc.prepare(model, sgd);
  acc.backward(F::cross_entropy(net(d.x), d.y));
  opt.step();
  const torch::Tensor trained = model->weight.detach().clone();

  int saves = 0, loads = 0;
  auto save_hook = acc.register_save_state_pre_hook([&](hasten::StateHookArgs& a) {
    ++saves;
    EXPECT_EQ(a.models, std::vector<size_t>{net.index()});
    a.models.clear();
    torch::save(model->weight.detach().clone(), a.dir + "/own_weight.pt");
  });
  const auto ckpt = (dir.path() / "ckpt").string();
  acc.save_state(ckpt);
  EXPECT_EQ(saves, 1);
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/own_weight.pt"));
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/model.safetensors"));

  // Without a load hook the weights hasten did not write are missing: one clear error.
  {
    torch::NoGradGuard no_grad;
    model->weight.zero_();
  }
  try {
    acc.load_state(ckpt);
    FAIL() << "loading a checkpoint without the model's weights must fail";
  } catch (const hasten::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model"), std::string::npos) << e.what();
  }
  auto load_hook = acc.register_load_state_pre_hook([&](hasten::StateHookArgs& a) {
    ++loads;
    EXPECT_EQ(a.dir, ckpt);
    a.models.clear();
    torch::Tensor w;
    torch::load(w, a.dir + "/own_weight.pt");
    torch::NoGradGuard no_grad;
    model->weight.copy_(w);
  });
  acc.load_state(ckpt);
  EXPECT_EQ(loads, 1);
  EXPECT_TRUE(torch::equal(model->weight.detach(), trained));

  // Removed: the next save writes the weights itself.
  save_hook.remove();
  load_hook.remove();
  const auto again = (dir.path() / "again").string();
  acc.save_state(again);
  EXPECT_EQ(saves, 1);
  EXPECT_TRUE(std::filesystem::exists(again + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(again + "/own_weight.pt"));

  // A hook may remove itself while it runs.
  hasten::HookHandle once;
  int runs = 0;
  once = acc.register_save_state_pre_hook([&](hasten::StateHookArgs&) {
    ++runs;
    once.remove();
  });
  acc.save_state((dir.path() / "once_a").string());
  acc.save_state((dir.path() / "once_b").string());
  EXPECT_EQ(runs, 1);
}
