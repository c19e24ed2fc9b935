// hasten::schedulers through the public API: every schedule's lr after k steps equals base *
// factor(k) for a factor transcribed here, separately, from transformers/optimization.py,
// for two param groups of different lrs, past `total` included; a handful of values by hand;
// misuse is one-line errors; prepared, the schedule advances once per real optimizer step
// under accumulation and a checkpoint resumes it where it stopped.
#include <hasten/accelerator.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace fs = std::filesystem;
namespace S = hasten::schedulers;
using hasten::Accelerator;
using hasten::Options;

namespace {

// ---- the transformers lr_lambdas, transcribed line by line --------------------------------

namespace ref {

const double pi = 3.141592653589793;  // math.pi

double constant(int64_t) { return 1.0; }

double constant_with_warmup(int64_t current_step, int64_t num_warmup_steps) {
  if (current_step < num_warmup_steps) return double(current_step) / std::max(1.0, double(num_warmup_steps));
  return 1.0;
}

double linear(int64_t current_step, int64_t num_warmup_steps, int64_t num_training_steps) {
  if (current_step < num_warmup_steps) return double(current_step) / double(std::max<int64_t>(1, num_warmup_steps));
  return std::max(0.0, double(num_training_steps - current_step) /
                           double(std::max<int64_t>(1, num_training_steps - num_warmup_steps)));
}

double cosine(int64_t current_step, int64_t num_warmup_steps, int64_t num_training_steps, double num_cycles) {
  if (current_step < num_warmup_steps) return double(current_step) / double(std::max<int64_t>(1, num_warmup_steps));
  const double progress =
      double(current_step - num_warmup_steps) / double(std::max<int64_t>(1, num_training_steps - num_warmup_steps));
  return std::max(0.0, 0.5 * (1.0 + std::cos(pi * double(num_cycles) * 2.0 * progress)));
}

double cosine_hard_restarts(int64_t current_step, int64_t num_warmup_steps, int64_t num_training_steps,
                            int64_t num_cycles) {
  if (current_step < num_warmup_steps) return double(current_step) / double(std::max<int64_t>(1, num_warmup_steps));
  const double progress =
      double(current_step - num_warmup_steps) / double(std::max<int64_t>(1, num_training_steps - num_warmup_steps));
  if (progress >= 1.0) return 0.0;
  const double x = double(num_cycles) * progress;
  return std::max(0.0, 0.5 * (1.0 + std::cos(pi * (x - std::floor(x)))));  // Python's x % 1.0
}

double polynomial(int64_t current_step, int64_t num_warmup_steps, int64_t num_training_steps, double lr_init,
                  double lr_end, double power) {
  if (current_step < num_warmup_steps) return double(current_step) / double(std::max<int64_t>(1, num_warmup_steps));
  if (current_step > num_training_steps) return lr_end / lr_init;
  const double lr_range = lr_init - lr_end;
  const double decay_steps = double(num_training_steps - num_warmup_steps);
  const double pct_remaining = 1 - double(current_step - num_warmup_steps) / decay_steps;
  const double decay = lr_range * std::pow(pct_remaining, power) + lr_end;
  return decay / lr_init;
}

}  // namespace ref

// ---- helpers ------------------------------------------------------------------------------

constexpr double kLrA = 0.1;   // the optimizer's default lr: group 0
constexpr double kLrB = 0.02;  // group 1's own lr

// Two param groups of different lrs on a small linear layer.
struct TwoGroups {
  explicit TwoGroups(const std::string& kind = "sgd") {
    torch::manual_seed(0);
    net = torch::nn::Linear(4, 2);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{net->weight});
    if (kind == "sgd") {
      groups.emplace_back(std::vector<torch::Tensor>{net->bias}, std::make_unique<torch::optim::SGDOptions>(kLrB));
      opt = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(kLrA));
    } else {
      groups.emplace_back(std::vector<torch::Tensor>{net->bias}, std::make_unique<torch::optim::AdamWOptions>(kLrB));
      opt = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(kLrA));
    }
  }
  std::vector<double> lrs() const {
    std::vector<double> out;
    for (auto& g : opt->param_groups()) out.push_back(g.options().get_lr());
    return out;
  }
  torch::nn::Linear net{nullptr};
  std::unique_ptr<torch::optim::Optimizer> opt;
};

// Steps the scheduler `steps` times and checks, before each step and after the last, that the
// optimizer's lrs, get_last_lr() and last_step() agree with base * factor(k).
void follows(const std::function<S::LambdaLR(torch::optim::Optimizer&)>& build,
             const std::function<double(int64_t)>& factor, int64_t steps, const std::string& kind = "sgd") {
  TwoGroups t(kind);
  S::LambdaLR sched = build(*t.opt);
  EXPECT_EQ(sched.base_lrs(), (std::vector<double>{kLrA, kLrB}));
  for (int64_t k = 0; k <= steps; ++k) {
    const std::vector<double> want = {kLrA * factor(k), kLrB * factor(k)};
    const std::vector<double> got = t.lrs();
    ASSERT_EQ(got.size(), 2u);
    EXPECT_DOUBLE_EQ(got[0], want[0]) << "group 0 after " << k << " steps";
    EXPECT_DOUBLE_EQ(got[1], want[1]) << "group 1 after " << k << " steps";
    EXPECT_EQ(sched.get_last_lr(), got) << "after " << k << " steps";
    EXPECT_EQ(sched.last_step(), k);
    sched.step();
  }
}

// The lr of group 0 (base kLrA) after `k` steps.
double lr_after(S::LambdaLR&& sched, torch::optim::Optimizer& opt, int64_t k) {
  for (int64_t i = 0; i < k; ++i) sched.step();
  return opt.param_groups()[0].options().get_lr();
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const hasten::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// ---- against the transcription --------------------------------------------------------------

TEST(Schedulers, ConstantFollowsTransformers) {
  follows([](auto& o) { return S::constant(o); }, ref::constant, 20);
}

TEST(Schedulers, ConstantWithWarmupFollowsTransformers) {
  follows([](auto& o) { return S::constant_with_warmup(o, 5); }, [](int64_t k) { return ref::constant_with_warmup(k, 5); },
          20);
  follows([](auto& o) { return S::constant_with_warmup(o, 0); }, [](int64_t k) { return ref::constant_with_warmup(k, 0); },
          5);
}

TEST(Schedulers, LinearWithWarmupFollowsTransformers) {
  follows([](auto& o) { return S::linear_with_warmup(o, 3, 17); }, [](int64_t k) { return ref::linear(k, 3, 17); }, 25);
  follows([](auto& o) { return S::linear_with_warmup(o, 0, 10); }, [](int64_t k) { return ref::linear(k, 0, 10); }, 14,
          "adamw");
}

TEST(Schedulers, CosineWithWarmupFollowsTransformers) {
  // Past total the cosine rises again, as in transformers.
  follows([](auto& o) { return S::cosine_with_warmup(o, 4, 20); }, [](int64_t k) { return ref::cosine(k, 4, 20, 0.5); },
          30);
  follows([](auto& o) { return S::cosine_with_warmup(o, 2, 13, 1.75); },
          [](int64_t k) { return ref::cosine(k, 2, 13, 1.75); }, 20, "adamw");
}

TEST(Schedulers, CosineWithHardRestartsFollowsTransformers) {
  follows([](auto& o) { return S::cosine_with_hard_restarts_with_warmup(o, 3, 23); },
          [](int64_t k) { return ref::cosine_hard_restarts(k, 3, 23, 1); }, 30);
  follows([](auto& o) { return S::cosine_with_hard_restarts_with_warmup(o, 3, 23, 3); },
          [](int64_t k) { return ref::cosine_hard_restarts(k, 3, 23, 3); }, 30);
}

TEST(Schedulers, PolynomialDecayWithWarmupFollowsTransformers) {
  // lr_init is the optimizer's default lr (group 0's); group 1 scales by the same factor.
  follows([](auto& o) { return S::polynomial_decay_with_warmup(o, 4, 16); },
          [](int64_t k) { return ref::polynomial(k, 4, 16, kLrA, 1e-7, 1.0); }, 24);
  follows([](auto& o) { return S::polynomial_decay_with_warmup(o, 2, 11, 0.003, 2.5); },
          [](int64_t k) { return ref::polynomial(k, 2, 11, kLrA, 0.003, 2.5); }, 15, "adamw");
}

TEST(Schedulers, MakeTakesTransformersSchedulerTypeNames) {
  follows([](auto& o) { return S::make("linear", o, 3, 12); }, [](int64_t k) { return ref::linear(k, 3, 12); }, 15);
  follows([](auto& o) { return S::make("cosine", o, 3, 12); }, [](int64_t k) { return ref::cosine(k, 3, 12, 0.5); }, 15);
  follows([](auto& o) { return S::make("cosine_with_restarts", o, 3, 12); },
          [](int64_t k) { return ref::cosine_hard_restarts(k, 3, 12, 1); }, 15);
  follows([](auto& o) { return S::make("polynomial", o, 3, 12); },
          [](int64_t k) { return ref::polynomial(k, 3, 12, kLrA, 1e-7, 1.0); }, 15);
  follows([](auto& o) { return S::make("constant", o, 3, 12); }, ref::constant, 15);
  follows([](auto& o) { return S::make("constant_with_warmup", o, 3, 12); },
          [](int64_t k) { return ref::constant_with_warmup(k, 3); }, 15);
}

// ---- by hand --------------------------------------------------------------------------------

TEST(Schedulers, HandValues) {
  auto at = [](const std::function<S::LambdaLR(torch::optim::Optimizer&)>& build, int64_t k) {
    TwoGroups t;
    return lr_after(build(*t.opt), *t.opt, k);
  };
  auto linear = [](auto& o) { return S::linear_with_warmup(o, 4, 12); };
  EXPECT_DOUBLE_EQ(at(linear, 0), 0.0);  // warmup starts from 0, already at the first step
  EXPECT_DOUBLE_EQ(at(linear, 2), 0.5 * kLrA);
  EXPECT_DOUBLE_EQ(at(linear, 4), kLrA);  // the end of warmup is the base lr
  EXPECT_DOUBLE_EQ(at(linear, 8), 0.5 * kLrA);
  EXPECT_DOUBLE_EQ(at(linear, 12), 0.0);
  EXPECT_DOUBLE_EQ(at(linear, 15), 0.0);

  auto cosine = [](auto& o) { return S::cosine_with_warmup(o, 4, 12); };
  EXPECT_DOUBLE_EQ(at(cosine, 4), kLrA);
  EXPECT_NEAR(at(cosine, 8), 0.5 * kLrA, 1e-15);  // the midpoint of the decay
  EXPECT_NEAR(at(cosine, 12), 0.0, 1e-15);
  auto full_cycle = [](auto& o) { return S::cosine_with_warmup(o, 0, 8, 1.0); };
  EXPECT_NEAR(at(full_cycle, 4), 0.0, 1e-15);
  EXPECT_NEAR(at(full_cycle, 8), kLrA, 1e-15);

  auto restarts = [](auto& o) { return S::cosine_with_hard_restarts_with_warmup(o, 2, 10, 2); };
  EXPECT_DOUBLE_EQ(at(restarts, 2), kLrA);
  EXPECT_NEAR(at(restarts, 4), 0.5 * kLrA, 1e-15);
  EXPECT_DOUBLE_EQ(at(restarts, 6), kLrA);  // the restart
  EXPECT_NEAR(at(restarts, 8), 0.5 * kLrA, 1e-15);
  EXPECT_DOUBLE_EQ(at(restarts, 10), 0.0);

  auto poly = [](auto& o) { return S::polynomial_decay_with_warmup(o, 2, 10, 0.001, 2.0); };
  EXPECT_DOUBLE_EQ(at(poly, 2), kLrA);
  EXPECT_NEAR(at(poly, 6), (0.1 - 0.001) * 0.25 + 0.001, 1e-15);
  EXPECT_NEAR(at(poly, 10), 0.001, 1e-15);  // lr_end at total ...
  EXPECT_NEAR(at(poly, 20), 0.001, 1e-15);  // ... and after it

  auto warm = [](auto& o) { return S::constant_with_warmup(o, 3); };
  EXPECT_DOUBLE_EQ(at(warm, 1), kLrA / 3);
  EXPECT_DOUBLE_EQ(at(warm, 3), kLrA);
  EXPECT_DOUBLE_EQ(at(warm, 50), kLrA);
}

TEST(Schedulers, AnyLambdaAndItsFactor) {
  TwoGroups t;
  S::LambdaLR halving(*t.opt, [](int64_t step) { return std::pow(0.5, double(step)); });
  EXPECT_DOUBLE_EQ(halving.factor(3), 0.125);
  halving.step();
  halving.step();
  EXPECT_EQ(t.lrs(), (std::vector<double>{kLrA / 4, kLrB / 4}));
}

// ---- misuse ---------------------------------------------------------------------------------

TEST(Schedulers, MisuseIsOneLineError) {
  TwoGroups t;
  auto& o = *t.opt;
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"constant_with_warmup: warmup (-1) must be >= 0", [&] { S::constant_with_warmup(o, -1); }},
      {"linear_with_warmup: warmup (-2) must be >= 0", [&] { S::linear_with_warmup(o, -2, 10); }},
      {"linear_with_warmup: total (5) must be greater than warmup (10): the decay needs at least one step",
       [&] { S::linear_with_warmup(o, 10, 5); }},
      {"cosine_with_warmup: total (10) must be greater than warmup (10): the decay needs at least one step",
       [&] { S::cosine_with_warmup(o, 10, 10); }},
      {"cosine_with_warmup: num_cycles (0) must be > 0", [&] { S::cosine_with_warmup(o, 1, 10, 0.0); }},
      {"cosine_with_warmup: num_cycles (-0.5) must be > 0", [&] { S::cosine_with_warmup(o, 1, 10, -0.5); }},
      {"cosine_with_hard_restarts_with_warmup: num_cycles (0) must be > 0",
       [&] { S::cosine_with_hard_restarts_with_warmup(o, 1, 10, 0); }},
      {"cosine_with_hard_restarts_with_warmup: total (3) must be greater than warmup (4): the decay needs at least one step",
       [&] { S::cosine_with_hard_restarts_with_warmup(o, 4, 3); }},
      {"polynomial_decay_with_warmup: lr_end (0.1) must be smaller than the optimizer's initial lr (0.1)",
       [&] { S::polynomial_decay_with_warmup(o, 1, 10, 0.1); }},
      {"polynomial_decay_with_warmup: lr_end (0.5) must be smaller than the optimizer's initial lr (0.1)",
       [&] { S::polynomial_decay_with_warmup(o, 1, 10, 0.5); }},
      {"polynomial_decay_with_warmup: lr_end (-0.001) must be >= 0",
       [&] { S::polynomial_decay_with_warmup(o, 1, 10, -0.001); }},
      {"polynomial_decay_with_warmup: power (0) must be > 0",
       [&] { S::polynomial_decay_with_warmup(o, 1, 10, 1e-7, 0.0); }},
      {"polynomial_decay_with_warmup: total (1) must be greater than warmup (1): the decay needs at least one step",
       [&] { S::polynomial_decay_with_warmup(o, 1, 1); }},
      {"schedulers::make: unknown schedule 'cosin'; did you mean 'cosine'? (known: linear, cosine, "
       "cosine_with_restarts, polynomial, constant, constant_with_warmup)",
       [&] { S::make("cosin", o, 1, 10); }},
      {"schedulers::make: unknown schedule 'onecycle' (known: linear, cosine, cosine_with_restarts, polynomial, "
       "constant, constant_with_warmup)",
       [&] { S::make("onecycle", o, 1, 10); }},
      // make names the schedule it builds.
      {"linear_with_warmup: warmup (-1) must be >= 0", [&] { S::make("linear", o, -1, 10); }},
  };
  for (auto& [want, fn] : cases) {
    const std::string got = error_of(fn);
    EXPECT_EQ(got.find('\n'), std::string::npos) << got;
    EXPECT_EQ(got, want);
  }
  // A refused schedule leaves the optimizer's lrs alone.
  EXPECT_EQ(t.lrs(), (std::vector<double>{kLrA, kLrB}));
}

TEST(Schedulers, ParamGroupAddedAfterwardsIsNamed) {
  TwoGroups t;
  auto sched = S::linear_with_warmup(*t.opt, 1, 10);
  const std::vector<torch::Tensor> extra = {torch::zeros({2}, torch::requires_grad())};
  t.opt->add_param_group(torch::optim::OptimizerParamGroup(extra));
  EXPECT_EQ(error_of([&] { sched.step(); }),
            "LambdaLR: the optimizer has 3 param groups, 2 when the scheduler was built; build the scheduler after "
            "add_param_group");
}

// ---- prepared -------------------------------------------------------------------------------

namespace {

// Options isolated from any user config file and environment settings.
Options isolated(const fs::path& project) {
  hasten::test::isolate_home();
  Options o;
  o.project_dir = project.string();
  o.gradient_accumulation_steps = 2;
  return o;
}

// One prepared run: a linear layer, SGD with two groups, a cosine schedule, accumulation 2.
struct PreparedRun {
  static constexpr int64_t kWarmup = 2, kTotal = 9;
  explicit PreparedRun(const fs::path& project)
      : acc(isolated(project)), sched(S::cosine_with_warmup(*t.opt, kWarmup, kTotal)) {
    auto [m, o, s] = acc.prepare(t.net, *t.opt, sched);
    model = std::make_unique<hasten::PreparedModel<torch::nn::Linear>>(m);
    opt = std::make_unique<hasten::PreparedOptimizer>(o);
    prepared = std::make_unique<hasten::PreparedScheduler<S::LambdaLR>>(s);
  }
  void micro_batch() {
    auto scope = acc.accumulate(*model);
    acc.backward((*model)(torch::ones({3, 4})).pow(2).sum());
    opt->step();
    prepared->step();
    opt->zero_grad();
  }
  static double factor(int64_t k) { return ref::cosine(k, kWarmup, kTotal, 0.5); }

  Accelerator acc;
  TwoGroups t;
  S::LambdaLR sched;
  std::unique_ptr<hasten::PreparedModel<torch::nn::Linear>> model;
  std::unique_ptr<hasten::PreparedOptimizer> opt;
  std::unique_ptr<hasten::PreparedScheduler<S::LambdaLR>> prepared;
};

}  // namespace

TEST(Schedulers, PreparedStepsOncePerRealOptimizerStep) {
  hasten::test::TempDir dir;
  PreparedRun run(dir.path());
  for (int64_t n = 1; n <= 14; ++n) {
    run.micro_batch();
    const int64_t real = n / 2;  // accumulation of 2
    EXPECT_EQ(run.sched.last_step(), real) << "after " << n << " micro-batches";
    EXPECT_DOUBLE_EQ(run.t.lrs()[0], kLrA * PreparedRun::factor(real)) << "after " << n << " micro-batches";
    EXPECT_DOUBLE_EQ(run.t.lrs()[1], kLrB * PreparedRun::factor(real)) << "after " << n << " micro-batches";
  }
}

TEST(Schedulers, CheckpointResumesTheSchedule) {
  hasten::test::TempDir dir;
  const std::string ckpt = (dir.path() / "ckpt").string();
  std::vector<double> uninterrupted;
  {
    PreparedRun run(dir.path());
    for (int n = 0; n < 6; ++n) run.micro_batch();
    run.acc.save_state(ckpt);
    for (int n = 0; n < 6; ++n) run.micro_batch();
    uninterrupted = run.t.lrs();
    EXPECT_EQ(run.sched.last_step(), 6);
  }
  PreparedRun resumed(dir.path());  // a fresh scheduler, at step 0
  EXPECT_EQ(resumed.sched.last_step(), 0);
  resumed.acc.load_state(ckpt);
  EXPECT_EQ(resumed.sched.last_step(), 3);
  EXPECT_DOUBLE_EQ(resumed.t.lrs()[0], kLrA * PreparedRun::factor(3));
  EXPECT_DOUBLE_EQ(resumed.sched.get_last_lr()[1], kLrB * PreparedRun::factor(3));
  for (int n = 0; n < 6; ++n) resumed.micro_batch();
  // Continues from step 3 (a scheduler left at 0 would be at factor(3) now, not factor(6)).
  EXPECT_EQ(resumed.sched.last_step(), 6);
  EXPECT_DOUBLE_EQ(resumed.t.lrs()[0], kLrA * PreparedRun::factor(6));
  EXPECT_EQ(resumed.t.lrs(), uninterrupted);
}
