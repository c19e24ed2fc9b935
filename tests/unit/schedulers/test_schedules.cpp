// hasten::schedulers on their own (the scheduler library, without an Accelerator): every
// schedule's lr after k steps equals base * factor(k) for a factor transcribed separately from
// transformers/optimization.py (schedule_reference.hpp), for two param groups of different lrs,
// past `total` included; OneCycleLR against PyTorch's; a handful of values by hand; misuse is
// one-line errors.
#include <hasten/schedulers.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "test_util.hpp"
#include "schedulers/schedule_reference.hpp"

namespace S = hasten::schedulers;
using namespace hasten::test::schedules;

namespace {

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
    const std::string got = hasten::test::error_of(fn);
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
  EXPECT_EQ(hasten::test::error_of([&] { sched.step(); }),
            "LambdaLR: the optimizer has 3 param groups, 2 when the scheduler was built; build the scheduler after "
            "add_param_group");
}

// ---- OneCycleLR ---------------------------------------------------------------------------

namespace {

double beta1(const torch::optim::Optimizer& opt, size_t group) {
  return std::get<0>(static_cast<const torch::optim::AdamWOptions&>(opt.param_groups()[group].options()).betas());
}

// Steps a OneCycleLR over two AdamW groups (max_lr 0.1 and 0.02) to total_steps and checks
// every lr and beta1 against the transcription, then that one more step is refused.
void one_cycle_follows(ref::OneCycleRef want, S::OneCycleOptions options) {
  TwoGroups t("adamw");
  S::OneCycleLR sched(*t.opt, std::vector<double>{kLrA, kLrB}, want.total_steps, options);
  ref::OneCycleRef want_b = want;
  want_b.max_lr = kLrB;
  want.max_lr = kLrA;
  for (int64_t k = 0; k <= want.total_steps; ++k) {
    EXPECT_EQ(sched.last_step(), k);
    EXPECT_DOUBLE_EQ(t.lrs()[0], want.at(k).first) << "group 0 after " << k << " steps";
    EXPECT_DOUBLE_EQ(t.lrs()[1], want_b.at(k).first) << "group 1 after " << k << " steps";
    EXPECT_DOUBLE_EQ(beta1(*t.opt, 0), want.at(k).second) << "beta1 after " << k << " steps";
    EXPECT_EQ(sched.get_last_lr(), t.lrs());
    if (k < want.total_steps) sched.step();
  }
  EXPECT_EQ(hasten::test::error_of([&] { sched.step(); }),
            "OneCycleLR: tried to step " + std::to_string(want.total_steps + 1) +
                " times; the specified number of total steps is " + std::to_string(want.total_steps));
  EXPECT_EQ(sched.last_step(), want.total_steps);  // the refused step changed nothing
}

}  // namespace

TEST(Schedulers, OneCycleFollowsPyTorchCosine) { one_cycle_follows({0, 10}, {}); }

TEST(Schedulers, OneCycleFollowsPyTorchLinearThreePhase) {
  S::OneCycleOptions o;
  o.anneal_strategy = "linear";
  o.three_phase = true;
  o.pct_start = 0.25;
  ref::OneCycleRef want{0, 12, 0.25, false, true};
  one_cycle_follows(want, o);
}

TEST(Schedulers, OneCycleByHand) {
  // Linear, max_lr 1, total 10: from 1/25 up to 1 at step 2 (0.3 * 10 - 1), then down to
  // 1/25/1e4 at step 9; SGD's momentum goes the other way, 0.95 -> 0.85 -> 0.95.
  torch::nn::Linear net(2, 1);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.5));
  S::OneCycleOptions o;
  o.anneal_strategy = "linear";
  S::OneCycleLR sched(sgd, 1.0, 10, o);
  auto momentum = [&] { return static_cast<torch::optim::SGDOptions&>(sgd.param_groups()[0].options()).momentum(); };
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.04);
  EXPECT_DOUBLE_EQ(momentum(), 0.95);
  sched.step();
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.52);
  EXPECT_DOUBLE_EQ(momentum(), 0.90);
  sched.step();
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 1.0);
  EXPECT_DOUBLE_EQ(momentum(), 0.85);
  for (int k = 2; k < 9; ++k) sched.step();
  EXPECT_NEAR(sgd.param_groups()[0].options().get_lr(), 4e-6, 1e-15);
  EXPECT_DOUBLE_EQ(momentum(), 0.95);
}

TEST(Schedulers, OneCycleMisuseIsOneLine) {
  TwoGroups t("adamw");
  torch::nn::Linear net(2, 1);
  torch::optim::Adagrad adagrad(net->parameters(), torch::optim::AdagradOptions(0.1));
  S::OneCycleOptions bad_pct;
  bad_pct.pct_start = 1.5;
  S::OneCycleOptions bad_anneal;
  bad_anneal.anneal_strategy = "cosine";
  S::OneCycleOptions no_momentum;
  no_momentum.cycle_momentum = false;
  EXPECT_EQ(hasten::test::error_of([&] { S::OneCycleLR(*t.opt, 0.1, 0); }),
            "OneCycleLR: total_steps (0) must be a positive integer");
  EXPECT_EQ(hasten::test::error_of([&] { S::OneCycleLR(*t.opt, 0.1, 10, bad_pct); }),
            "OneCycleLR: pct_start (1.5) must be between 0 and 1");
  EXPECT_EQ(hasten::test::error_of([&] { S::OneCycleLR(*t.opt, 0.1, 10, bad_anneal); }),
            "OneCycleLR: anneal_strategy 'cosine' is not one of cos, linear");
  EXPECT_EQ(hasten::test::error_of([&] { S::OneCycleLR(*t.opt, std::vector<double>{0.1, 0.2, 0.3}, 10); }),
            "OneCycleLR: 3 max_lr values for 2 param groups; give one, or one per group");
  EXPECT_EQ(hasten::test::error_of([&] { S::OneCycleLR(adagrad, 0.1, 10); }),
            "OneCycleLR: cycle_momentum needs an optimizer with betas (Adam, AdamW) or momentum (SGD, RMSprop); set "
            "cycle_momentum = false for this one");
  S::OneCycleLR plain(adagrad, 0.1, 10, no_momentum);  // without momentum cycling any optimizer will do
  EXPECT_DOUBLE_EQ(adagrad.param_groups()[0].options().get_lr(), 0.1 / 25);
  EXPECT_EQ(t.lrs(), (std::vector<double>{kLrA, kLrB}));  // refused schedules left the lrs alone
}
