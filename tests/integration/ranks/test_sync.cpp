// Gradient synchronisation through the public API, on 2 ranks under ddp, zero2 and zero3:
// hasten's own versions of the checks of Accelerate's test_utils/scripts/test_sync.py
// (no_sync, trigger_sync_in_backward, accumulate with and without sync_each_batch, the
// dataloader's end, the gradient state) and of its join tests (test_distributed_data_loop.py;
// under ddp, zero1 and zero2, zero3/fsdp refused), of test_scheduler.py (OneCycleLR, with and
// without adjust_scheduler), plus hasten's departures from Accelerate's arithmetic, each both
// ways.
//
// "In sync" is checked against a ground-truth model trained in one process on the batches of
// both ranks gathered: its gradient (ddp: the prepared model's .grad, every element; every
// strategy: the global gradient norm from clip_grad_norm_, which under zero is over the
// reduced shards) and, after optimizer steps, its parameters (get_state_dict).
#include <hasten/hasten.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"

// A namespace per file: the files of this executable compile as one unit.
namespace sync_tests {

using hasten::Accelerator;
using hasten::Options;
namespace F = torch::nn::functional;

namespace {

// Accelerate's RegressionModel: y = a * x + b, a and b start at 0.
struct RegressionImpl : torch::nn::Cloneable<RegressionImpl> {
  RegressionImpl() { reset(); }
  void reset() override {
    a = register_parameter("a", torch::zeros({1}));
    b = register_parameter("b", torch::zeros({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x * a + b; }
  torch::Tensor a, b;
};
TORCH_MODULE(Regression);

// Accelerate's RegressionDataset: y = 2x + 3 + noise, seeded.
hasten::TensorDataset regression_data(int64_t length) {
  torch::manual_seed(42);
  auto x = torch::randn({length});
  auto y = 2 * x + 3 + 0.1 * torch::randn({length});
  return hasten::TensorDataset(x, y);
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

std::string str(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.reshape(-1);
  return out.str();
}

// The ground truth: a plain copy trained on the gathered batch.
struct Truth {
  Regression model;
  void backward(const torch::Tensor& x, const torch::Tensor& y, double divisor = 1) {
    (F::mse_loss(model(x), y) / divisor).backward();
  }
  torch::Tensor grad() const { return torch::cat({model->a.grad(), model->b.grad()}); }
  double grad_norm() const { return grad().norm().item<double>(); }
};

// The prepared model's gradient as this rank sees it: every element under ddp (undefined
// under zero, whose gradients live in shards) and the global norm under every strategy.
template <class M>
void expect_sync(Accelerator& acc, const M& model, const Regression& net, const Truth& truth, bool in_sync,
                 const std::string& where) {
  const double norm = acc.clip_grad_norm_(model, 1e30);
  const bool norm_equal = std::abs(norm - truth.grad_norm()) <= 1e-5 * (1 + truth.grad_norm());
  check(norm_equal == in_sync, where + ": gradient norm " + std::to_string(norm) + " vs the truth's " +
                                   std::to_string(truth.grad_norm()) + (in_sync ? " (should be in sync)" : " (should not be)"));
  if (acc.strategy() != "ddp") return;
  auto mine = torch::cat({net->a.grad(), net->b.grad()});
  check(torch::allclose(mine, truth.grad(), 1e-5, 1e-6) == in_sync,
        where + ": gradient " + str(mine) + " vs the truth's " + str(truth.grad()) + (in_sync ? " (should be in sync)" : " (should not be)"));
  // Between ranks: equal exactly when reduced.
  auto both = acc.gather(mine.unsqueeze(0));
  check(torch::allclose(both[0], both[1]) == in_sync, where + ": ranks' gradients " + str(both) + (in_sync ? " differ" : " agree"));
}

void run_on_two(const std::function<void()>& fn) { hasten::launch(fn, hasten::test::with_ranks(2)); }

class Sync : public ::testing::TestWithParam<std::string> {};

}  // namespace

// test_distributed_sync: inside no_sync the ranks' gradients stay local (and differ from the
// truth's); the next backward outside reduces the sum of both.
TEST_P(Sync, NoSyncKeepsGradientsLocalUntilABackwardOutsideIt) {
  const std::string strategy = GetParam();
  run_on_two([strategy] {
    Options o;
    o.strategy = strategy;
    Accelerator acc(o);
    Truth truth{Regression()};
    Regression net;
    auto [model, loader] = acc.prepare(net, hasten::DataLoader(regression_data(80), {16}));
    auto batch = *loader.begin();
    auto x = batch.input, y = batch.target;
    for (int it = 0; it < 3; ++it) {
      truth.backward(acc.gather(x), acc.gather(y));
      if (it % 2 == 0) {
        auto local = acc.no_sync(model);
        acc.backward(F::mse_loss(model(x), y));
      } else {
        acc.backward(F::mse_loss(model(x), y));
      }
      expect_sync(acc, model, net, truth, it % 2 == 1, "iteration " + std::to_string(it));
      torch::manual_seed(1337 + it);
      auto perm = torch::randperm(x.size(0));
      x = x.index_select(0, perm);  // shuffled (not y): the gradients keep changing
    }
  });
}

// test_distributed_sync_multiple_fwd: forwards under no_sync, backwards after it: local
// (the forward decided, as with DDP) until trigger_sync_in_backward reduces all of them.
TEST_P(Sync, ForwardsUnderNoSyncStayLocalUntilTriggerSyncInBackward) {
  const std::string strategy = GetParam();
  run_on_two([strategy] {
    Options o;
    o.strategy = strategy;
    Accelerator acc(o);
    Truth truth{Regression()};
    Regression net;
    auto [model, loader] = acc.prepare(net, hasten::DataLoader(regression_data(80), {16}));
    std::vector<torch::Tensor> losses;
    int it = 0;
    for (auto& batch : loader) {
      if (it++ == 3) break;
      truth.backward(acc.gather(batch.input), acc.gather(batch.target));
      auto local = acc.no_sync(model);
      losses.push_back(F::mse_loss(model(batch.input), batch.target));
    }
    for (size_t i = 0; i < losses.size(); ++i) {
      if (i + 1 < losses.size()) {
        acc.backward(losses[i], true);
        // The truth has all three; the local sum so far is partial and unreduced.
        expect_sync(acc, model, net, truth, false, "backward " + std::to_string(i));
      } else {
        auto trigger = acc.trigger_sync_in_backward(model);
        acc.backward(losses[i]);
      }
    }
    expect_sync(acc, model, net, truth, true, "the triggered backward");
  });
}

namespace {

struct AccumulateCase {
  bool split_batches = false;
  bool sync_each_batch = false;
  bool accelerate_division = false;  // short_window_loss_division: steps
};

// test_gradient_accumulation: accumulate over 2 micro-batches; in sync on every 2nd, on the
// loader's last, and on every one with sync_each_batch. The truth divides by 2, except (by
// hasten's default) the last window of one micro-batch, which it divides by 1.
void accumulate_case(const std::string& strategy, AccumulateCase c) {
  run_on_two([strategy, c] {
    Options o;
    o.strategy = strategy;
    o.gradient_accumulation_steps = 2;
    o.split_batches = c.split_batches;
    o.sync_each_batch = c.sync_each_batch;
    if (c.accelerate_division) o.short_window_loss_division = "steps";
    Accelerator acc(o);
    Truth truth{Regression()};
    Regression net;
    auto [model, loader] = acc.prepare(net, hasten::DataLoader(regression_data(80), {16}));
    const int64_t n = static_cast<int64_t>(loader.size());
    check(n == (c.split_batches ? 5 : 3), "batches per rank: " + std::to_string(n));
    int64_t it = 0;
    for (auto& batch : loader) {
      const bool last = it == n - 1;
      // The last window has one micro-batch (n is odd).
      const double divisor = last && !c.accelerate_division ? 1 : 2;
      truth.backward(acc.gather(batch.input), acc.gather(batch.target), divisor);
      {
        auto scope = acc.accumulate(model);
        acc.backward(F::mse_loss(model(batch.input), batch.target));
        const auto state = acc.gradient_state();
        check(state.sync_gradients == ((it + 1) % 2 == 0 || last), "sync_gradients at " + std::to_string(it));
        check(state.end_of_dataloader == last, "end_of_dataloader at " + std::to_string(it));
        check(state.sync_each_batch == c.sync_each_batch && state.num_steps == 2, "the state's options");
        check(state.remainder == (c.split_batches ? 0 : 80 % 32), "remainder " + std::to_string(state.remainder));
      }
      const bool in_sync = (it + 1) % 2 == 0 || last || c.sync_each_batch;
      expect_sync(acc, model, net, truth, in_sync, "micro-batch " + std::to_string(it));
      ++it;
    }
    check(acc.gradient_state().remainder == -1 && !acc.gradient_state().in_dataloader, "the state after the loop");
  });
}

}  // namespace

TEST_P(Sync, AccumulateSyncsEveryNthMicroBatchAndAtTheLoadersEnd) {
  accumulate_case(GetParam(), {});
}
TEST_P(Sync, AccumulateWithSyncEachBatchReducesEveryMicroBatch) {
  accumulate_case(GetParam(), {false, true, false});
}
TEST_P(Sync, AccumulateWithSplitBatchesAndAccelerateLossDivision) {
  accumulate_case(GetParam(), {true, false, true});
}
TEST_P(Sync, AccumulateAccelerateLossDivisionWithSyncEachBatch) {
  accumulate_case(GetParam(), {false, true, true});
}

namespace {

// test_gradient_accumulation_with_opt_and_scheduler: AdamW and a LambdaLR (epoch^0.65) step
// on every 2nd micro-batch and at the loader's end; the learning rates agree with a truth whose
// schedule steps once per optimizer step (hasten) or num_processes times unless split_batches
// (scheduler_steps_per_process, Accelerate's AcceleratedScheduler), and so do the weights.
void scheduler_case(const std::string& strategy, bool per_process, bool split_batches) {
  run_on_two([strategy, per_process, split_batches] {
    Options o;
    o.strategy = strategy;
    o.gradient_accumulation_steps = 2;
    o.split_batches = split_batches;
    o.scheduler_steps_per_process = per_process;
    o.short_window_loss_division = "steps";  // the truth divides by 2 throughout, as Accelerate's
    Accelerator acc(o);
    Truth truth{Regression()};
    Regression net;
    auto factor = [](int64_t epoch) { return std::pow(static_cast<double>(epoch), 0.65); };
    torch::optim::AdamW opt(truth.model->parameters(), torch::optim::AdamWOptions(1e-1));
    hasten::schedulers::LambdaLR sched(opt, factor);
    torch::optim::AdamW acc_opt(net->parameters(), torch::optim::AdamWOptions(1e-1));
    hasten::schedulers::LambdaLR acc_sched(acc_opt, factor);
    auto [model, popt, psched, loader] =
        acc.prepare(net, acc_opt, acc_sched, hasten::DataLoader(regression_data(80), {16}));
    const int64_t n = static_cast<int64_t>(loader.size());
    const int sched_steps = per_process && !split_batches ? acc.num_processes() : 1;
    int64_t it = 0;
    for (auto& batch : loader) {
      const bool did_step = (it + 1) % 2 == 0 || it + 1 == n;
      truth.backward(acc.gather(batch.input), acc.gather(batch.target), 2);
      if (did_step) {
        opt.step();
        for (int k = 0; k < sched_steps; ++k) sched.step();
        opt.zero_grad();
      }
      {
        auto scope = acc.accumulate(model);
        acc.backward(F::mse_loss(model(batch.input), batch.target));
        popt.step();
        psched.step();
        popt.zero_grad();
      }
      const double lr = opt.param_groups()[0].options().get_lr();
      const double plr = acc_opt.param_groups()[0].options().get_lr();
      check(lr == plr, "learning rates at " + std::to_string(it) + ": " + std::to_string(lr) + " vs " + std::to_string(plr));
      ++it;
    }
    check(sched.last_step() == acc_sched.last_step(), "scheduler steps " + std::to_string(acc_sched.last_step()));
    check(acc_sched.last_step() == sched_steps * (split_batches ? 3 : 2), "scheduler steps: " + std::to_string(acc_sched.last_step()));
    auto state = acc.get_state_dict(model);
    if (acc.is_main_process())
      for (auto& [name, t] : state) {
        auto want = name == "a" ? truth.model->a : truth.model->b;
        check(torch::allclose(t, want, 1e-4, 1e-5), name + ": " + str(t) + " vs the truth's " + str(want));
      }
  });
}

}  // namespace

TEST_P(Sync, SchedulerStepsOncePerOptimizerStepByDefault) { scheduler_case(GetParam(), false, false); }
TEST_P(Sync, SchedulerStepsPerProcessIsAcceleratesArithmetic) { scheduler_case(GetParam(), true, false); }
TEST_P(Sync, SchedulerStepsPerProcessStepsOnceWithSplitBatches) { scheduler_case(GetParam(), true, true); }

INSTANTIATE_TEST_SUITE_P(Strategies, Sync, ::testing::Values("ddp", "zero2", "zero3"));

namespace {

// test_scheduler.py's one_cycle_test on 2 ranks, then Accelerate's loop (the scheduler's
// step() on every micro-batch, accumulation 2) with a OneCycleLR of total_steps 6: last_step()
// after each of 8 micro-batches. Accelerate's arithmetic steps it num_processes times per
// optimizer step while 1 + steps (+ the micro-batches counted by adjust_scheduler) <= 6.
void one_cycle_case(std::optional<bool> per_process, std::optional<bool> adjust, std::vector<int64_t> want) {
  run_on_two([per_process, adjust, want] {
    auto options = [&](int accumulation) {
      Options o;
      o.gradient_accumulation_steps = accumulation;
      o.scheduler_steps_per_process = per_process;
      o.adjust_scheduler = adjust;
      return o;
    };
    {
      Accelerator acc(options(1));
      torch::nn::Linear net(2, 4);
      torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(1.0));
      hasten::schedulers::OneCycleLR sched(opt, 0.01, /*total_steps=*/2);  // steps_per_epoch 2, epochs 1
      auto [model, popt, psched] = acc.prepare(net, opt, sched);
      psched.step();
      const int64_t expected = per_process.value_or(false) ? acc.num_processes() : 1;
      check(sched.last_step() == expected, "one_cycle_test: last_step " + std::to_string(sched.last_step()));
    }
    Accelerator acc(options(2));
    torch::nn::Linear net(2, 4);
    torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(1.0));
    hasten::schedulers::OneCycleLR sched(opt, 0.01, /*total_steps=*/6);
    auto [model, popt, psched] = acc.prepare(net, opt, sched);
    std::vector<int64_t> got;
    for (int n = 0; n < 8; ++n) {
      auto scope = acc.accumulate(model);
      acc.backward(model(torch::ones({3, 2})).pow(2).sum());
      popt.step();
      psched.step();
      popt.zero_grad();
      got.push_back(sched.last_step());
    }
    std::ostringstream text;
    for (auto k : got) text << k << ' ';
    check(got == want, "last_step after each micro-batch: " + text.str());
  });
}

}  // namespace

TEST(SchedulerArithmetic, OneCycleOncePerOptimizerStepByDefault) {
  one_cycle_case(std::nullopt, std::nullopt, {0, 1, 1, 2, 2, 3, 3, 4});
}
TEST(SchedulerArithmetic, OneCycleAccelerateWithAdjustScheduler) {
  // micro-batch 2: 1+0+1, 1+1+1 <= 6; 4: 1+2+2, 1+3+2 <= 6; 6: 1+4+3 > 6, stopped.
  one_cycle_case(true, std::nullopt, {0, 2, 2, 4, 4, 4, 4, 4});
}
TEST(SchedulerArithmetic, OneCycleAccelerateWithoutAdjustScheduler) {
  // only steps count: 2, 4, then 1+4 and 1+5 <= 6, then stopped at 6.
  one_cycle_case(true, false, {0, 2, 2, 4, 4, 6, 6, 6});
}

// test_dataloader_break: the gradient state follows the innermost loader, nested loops
// included, and its end.
TEST(GradientState, FollowsTheInnermostLoaderAndItsEnd) {
  hasten::test::isolate_home();
  Accelerator acc;
  auto [first, second] = acc.prepare(hasten::DataLoader(regression_data(80), {16}),
                                     hasten::DataLoader(regression_data(96), {16}));
  EXPECT_FALSE(acc.gradient_state().in_dataloader);
  EXPECT_EQ(acc.gradient_state().active_dataloader, -1);
  size_t it = 0;
  for (auto& batch : first) {
    (void)batch;
    EXPECT_EQ(acc.gradient_state().active_dataloader, static_cast<int64_t>(first.index()));
    EXPECT_EQ(acc.gradient_state().remainder, 0);
    if (it < first.size() - 1) {
      EXPECT_FALSE(acc.gradient_state().end_of_dataloader) << it;
      if (it == 1) {
        size_t inner = 0;
        for (auto& b : second) {
          (void)b;
          EXPECT_EQ(acc.gradient_state().active_dataloader, static_cast<int64_t>(second.index()));
          EXPECT_EQ(acc.gradient_state().end_of_dataloader, inner == second.size() - 1) << inner;
          ++inner;
        }
        EXPECT_EQ(inner, 6u);
      }
    } else {
      EXPECT_TRUE(acc.gradient_state().end_of_dataloader);
    }
    ++it;
  }
  EXPECT_EQ(it, 5u);
  EXPECT_EQ(acc.gradient_state().active_dataloader, -1);
}

// test_noop_sync: with one process no_sync changes nothing: the gradients are always the
// truth's.
TEST(GradientState, NoSyncOnOneProcessIsANoOp) {
  hasten::test::isolate_home();
  Accelerator acc;
  Truth truth{Regression()};
  Regression net;
  auto [model, loader] = acc.prepare(net, hasten::DataLoader(regression_data(80), {16}));
  auto batch = *loader.begin();
  auto x = batch.input, y = batch.target;
  for (int it = 0; it < 3; ++it) {
    truth.backward(x, y);
    if (it % 2 == 0) {
      auto local = acc.no_sync(model);
      acc.backward(F::mse_loss(model(x), y));
    } else {
      acc.backward(F::mse_loss(model(x), y));
    }
    auto mine = torch::cat({net->a.grad(), net->b.grad()});
    EXPECT_TRUE(torch::allclose(mine, truth.grad())) << it << ": " << str(mine) << " vs " << str(truth.grad());
    torch::manual_seed(1337 + it);
    x = x.index_select(0, torch::randperm(x.size(0)));
  }
}

// sync_with_dataloader false: the loader's end no longer closes the window (the count runs on).
TEST(GradientState, SyncWithDataloaderFalseLetsWindowsRunAcrossTheEnd) {
  hasten::test::isolate_home();
  for (bool with_loader : {true, false}) {
    Options o;
    o.gradient_accumulation_steps = 2;
    o.sync_with_dataloader = with_loader;
    Accelerator acc(o);
    Regression net;
    auto [model, loader] = acc.prepare(net, hasten::DataLoader(regression_data(48), {16}));
    std::vector<bool> syncs;
    for (int epoch = 0; epoch < 2; ++epoch)
      for (auto& batch : loader) {
        auto scope = acc.accumulate(model);
        acc.backward(F::mse_loss(model(batch.input), batch.target));
        syncs.push_back(acc.sync_gradients());
      }
    const std::vector<bool> want = with_loader ? std::vector<bool>{false, true, true, false, true, true}
                                               : std::vector<bool>{false, true, false, true, false, true};
    EXPECT_EQ(syncs, want) << "sync_with_dataloader " << with_loader;
  }
}

// Departure (c): an out-of-range dim is an error by default, the tensor unchanged with
// pad_out_of_range_dim: unchanged (Accelerate's).
TEST(Departures, PadAcrossProcessesOutOfRangeDimBothWays) {
  hasten::test::isolate_home();
  auto t = torch::arange(6).reshape({2, 3});
  {
    Accelerator acc;
    try {
      acc.pad_across_processes(t, 2);
      FAIL() << "dim 2 of a 2-dimensional tensor must be refused by default";
    } catch (const hasten::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("is out of range for a tensor of"), std::string::npos) << e.what();
    }
  }
  Options o;
  o.pad_out_of_range_dim = "unchanged";
  Accelerator acc(o);
  EXPECT_TRUE(torch::equal(acc.pad_across_processes(t, 2), t));
  EXPECT_TRUE(torch::equal(acc.pad_across_processes(t, -3), t));
  EXPECT_TRUE(torch::equal(acc.pad_across_processes(t, 1), t));  // in range: padded as ever (one process)
}

TEST(Departures, BadValuesOfTheNewKeysAreOneClearLine) {
  hasten::test::isolate_home();
  Options o;
  o.short_window_loss_division = "mean";
  try {
    Accelerator acc(o);
    FAIL() << "short_window_loss_division: mean must be refused";
  } catch (const hasten::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("short_window_loss_division"), std::string::npos) << what;
    EXPECT_NE(what.find("steps"), std::string::npos) << what;
  }
}

namespace {

// Accelerate's join test: 3 samples of batch 1 on 2 ranks with even_batches false: rank 0
// gets samples 0 and 2, rank 1 sample 1; rank 1 leaves after one step and answers rank 0's
// second reduction with zeros. The weights after the scope are the truth's on both ranks.
void join_case(bool override_even_batches, bool divide_by_initial) {
  run_on_two([override_even_batches, divide_by_initial] {
    Options o;
    o.set = {{"strategy", "ddp"}};
    if (!override_even_batches) o.even_batches = false;
    Accelerator acc(o);
    torch::manual_seed(0);
    torch::nn::Linear net(1, 1);
    torch::nn::Linear truth(1, 1);
    {
      torch::NoGradGuard g;
      truth->weight.copy_(net->weight);
      truth->bias.copy_(net->bias);
    }
    auto xs = torch::tensor({1.0f, -2.0f, 3.0f}).reshape({3, 1});
    auto ys = torch::tensor({0.5f, 1.0f, -1.0f}).reshape({3, 1});
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    auto [model, opt, loader] = acc.prepare(net, sgd, hasten::DataLoader(hasten::TensorDataset(xs, ys), {1}));
    std::vector<int64_t> seen;
    {
      hasten::JoinOptions jo;
      if (override_even_batches) jo.even_batches = false;
      jo.divide_by_initial_world_size = divide_by_initial;
      auto join = acc.join_uneven_inputs({model}, jo);
      check(loader.size() == (acc.process_index() == 0 ? 2u : 1u), "batches in the scope: " + std::to_string(loader.size()));
      for (auto& batch : loader) {
        acc.backward(F::mse_loss(model(batch.input), batch.target));
        opt.step();
        opt.zero_grad();
        seen.push_back(batch.indices[0].item<int64_t>());
      }
    }
    const std::vector<int64_t> want = acc.process_index() == 0 ? std::vector<int64_t>{0, 2} : std::vector<int64_t>{1};
    check(seen == want, "rank " + std::to_string(acc.process_index()) + " saw other samples");
    // The truth: step 1 averages samples 0 and 1; step 2 has sample 2 alone, divided by 2
    // (the initial world) or by 1.
    torch::optim::SGD tsgd(truth->parameters(), torch::optim::SGDOptions(0.1));
    auto loss = [&](int i) { return F::mse_loss(truth(xs[i].unsqueeze(0)), ys[i].unsqueeze(0)); };
    ((loss(0) + loss(1)) / 2).backward();
    tsgd.step();
    tsgd.zero_grad();
    (loss(2) / (divide_by_initial ? 2.0 : 1.0)).backward();
    tsgd.step();
    check(torch::allclose(net->weight, truth->weight) && torch::allclose(net->bias, truth->bias),
          "rank " + std::to_string(acc.process_index()) + ": weight " + str(net->weight) + " bias " + str(net->bias) +
              " vs the truth's " + str(truth->weight) + " " + str(truth->bias));
    // After the scope the override is gone: the loader is even again (2 batches each).
    if (override_even_batches) check(loader.size() == 2u, "batches after the scope: " + std::to_string(loader.size()));
    acc.wait_for_everyone();  // collectives line up again after the scope
  });
}

}  // namespace

TEST(Join, UnevenInputsFinishAndTheWeightsAreTheLastFinishers) { join_case(false, true); }
TEST(Join, EvenBatchesOverrideAndDivisionByTheRanksStillTraining) { join_case(true, false); }

namespace {

// join_uneven_inputs under zero1/zero2: rank 0 trains on samples 0, 2, 4, 5, rank 1 on 1, 3
// (batch 1), with AdamW, a schedule that moves the lr every step and clip_grad_norm_ each
// step. Rank 1 leaves after two steps and shadows rank 0's last two backwards, clippings and
// steps (its shard of the parameters and of the optimizer state steps too, at rank 0's lr: its
// own schedule stopped with its loop). Every rank ends with the weights of one process
// training a copy on the same batches: steps of samples {0, 1}, {2, 3}, {4}, {5}, each loss
// divided by 2 (the initial world) or, once alone, by 1.
void sharded_join_case(const std::string& strategy, bool divide_by_initial) {
  run_on_two([strategy, divide_by_initial] {
    Options o;
    o.set = {{"strategy", strategy}};
    o.even_batches = false;
    Accelerator acc(o);
    torch::manual_seed(0);
    torch::nn::Linear net(3, 2);
    torch::nn::Linear truth(3, 2);
    {
      torch::NoGradGuard g;
      truth->weight.copy_(net->weight);
      truth->bias.copy_(net->bias);
    }
    torch::manual_seed(7);
    auto xs = torch::randn({6, 3});
    auto ys = torch::randn({6, 2});
    auto factor = [](int64_t k) { return 1.0 / (1.0 + static_cast<double>(k)); };
    torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(0.1));
    hasten::schedulers::LambdaLR sched(adamw, factor);
    auto [model, opt, psched] = acc.prepare(net, adamw, sched);
    constexpr double kClip = 0.3;
    const std::vector<int> mine = acc.process_index() == 0 ? std::vector<int>{0, 2, 4, 5} : std::vector<int>{1, 3};
    {
      hasten::JoinOptions jo;
      jo.divide_by_initial_world_size = divide_by_initial;
      auto join = acc.join_uneven_inputs({model}, jo);
      for (int i : mine) {
        opt.zero_grad();
        acc.backward(F::mse_loss(model(xs[i].unsqueeze(0)), ys[i].unsqueeze(0)));
        acc.clip_grad_norm_(model, kClip);
        opt.step();
        psched.step();
      }
    }
    torch::optim::AdamW tadamw(truth->parameters(), torch::optim::AdamWOptions(0.1));
    hasten::schedulers::LambdaLR tsched(tadamw, factor);
    auto loss = [&](int i) { return F::mse_loss(truth(xs[i].unsqueeze(0)), ys[i].unsqueeze(0)); };
    const std::vector<std::vector<int>> steps = {{0, 1}, {2, 3}, {4}, {5}};
    for (auto& samples : steps) {
      tadamw.zero_grad();
      const double divisor = samples.size() == 1 && !divide_by_initial ? 1.0 : 2.0;
      torch::Tensor l = loss(samples[0]);
      for (size_t k = 1; k < samples.size(); ++k) l = l + loss(samples[k]);
      (l / divisor).backward();
      torch::nn::utils::clip_grad_norm_(truth->parameters(), kClip);
      tadamw.step();
      tsched.step();
    }
    check(torch::allclose(net->weight, truth->weight, 1e-5, 1e-6) && torch::allclose(net->bias, truth->bias, 1e-5, 1e-6),
          strategy + " rank " + std::to_string(acc.process_index()) + ": weight " + str(net->weight) + " bias " +
              str(net->bias) + " vs the truth's " + str(truth->weight) + " " + str(truth->bias));
    acc.wait_for_everyone();  // collectives line up again after the scope
  });
}

}  // namespace

TEST(Join, UnevenInputsUnderZero1StepEveryShardAsOneProcess) { sharded_join_case("zero1", true); }
TEST(Join, UnevenInputsUnderZero2StepEveryShardAsOneProcess) { sharded_join_case("zero2", true); }
TEST(Join, UnevenInputsUnderZero2DividedByTheRanksStillTraining) { sharded_join_case("zero2", false); }

TEST(Join, UnevenInputsUnderZero3OrFsdpAreRefusedWithOneLine) {
  for (const std::string strategy : {"zero3", "fsdp"}) {
    run_on_two([strategy] {
      Options o;
      o.set = {{"strategy", strategy}};
      Accelerator acc(o);
      Regression net;
      auto model = acc.prepare(net);
      try {
        hasten::JoinOptions jo;
        jo.even_batches = false;
        auto join = acc.join_uneven_inputs({model}, jo);
        throw std::runtime_error(strategy + " with uneven inputs must be refused");
      } catch (const hasten::UsageError& e) {
        const std::string what = e.what();
        check(what.find("shards the parameters at rest (ZeRO stage 3, FSDP)") != std::string::npos &&
                  what.find("Use zero1, zero2 or ddp") != std::string::npos && what.find('\n') == std::string::npos,
              what);
      }
      // Even inputs need no joining: the scope is allowed (and does nothing).
      { auto join = acc.join_uneven_inputs({model}); }
      acc.wait_for_everyone();
    });
  }
}

}  // namespace sync_tests
