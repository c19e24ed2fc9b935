// The checks of Accelerate's multi-process test scripts (src/accelerate/test_utils/scripts/
// test_sync.py, test_script.py, test_distributed_data_loop.py, external_deps/test_metrics.py,
// test_ops.py) that the other suites did not cover yet, on 2 ranks, under ddp, zero2 and zero3
// where the strategy can matter. docs/accelerate-parity.md maps every check of those files to
// the test that covers it.
//
// Accelerate compares a distributed run with a single-process one; so do these tests: the
// reference is plain LibTorch in the same worker, over the global order a hasten loader
// deals (RandomSampler(n, seed).indices(epoch) for shuffle with that seed).
#include <hasten/hasten.hpp>
#include <hasten/logging.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "test_tensor_util.hpp"
#include "test_util.hpp"

// A namespace per file: the files of this executable compile as one unit.
namespace accelerate_parity_tests {

using hasten::Accelerator;
using hasten::Options;
namespace F = torch::nn::functional;

namespace {

using hasten::test::require;
using hasten::test::to_vector;

std::string str(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.reshape(-1);
  return out.str();
}

// Accelerate's RegressionModel: y = a * x + b.
struct RegressionImpl : torch::nn::Cloneable<RegressionImpl> {
  explicit RegressionImpl(double a0 = 0, double b0 = 0) : a0_(a0), b0_(b0) { reset(); }
  void reset() override {
    a = register_parameter("a", torch::full({1}, a0_));
    b = register_parameter("b", torch::full({1}, b0_));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x * a + b; }
  torch::Tensor a, b;
  double a0_, b0_;
};
TORCH_MODULE(Regression);

// Accelerate's RegressionDataset: y = 2x + 3 + noise, from a seeded generator.
hasten::TensorDataset regression_data(int64_t length) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  auto x = at::normal(0, 1, {length}, gen);
  auto y = 2 * x + 3 + at::normal(0, 0.1, {length}, gen);
  return hasten::TensorDataset(x, y);
}

// A dataset whose samples are their own index.
hasten::TensorDataset numbers(int64_t n) { return hasten::TensorDataset(torch::arange(n), torch::arange(n) % 2); }

// Accelerate's DummyIterableDataset: a stream of n samples.
struct Stream {
  int64_t n = 0;
  int64_t next_value = 0;
  std::optional<torch::data::Example<>> next() {
    if (next_value >= n) return std::nullopt;
    auto v = next_value++;
    return torch::data::Example<>(torch::tensor(v), torch::tensor(v % 2));
  }
  void reset() { next_value = 0; }
};

hasten::LaunchOptions two_ranks() {
  static hasten::test::TempDir home;
  hasten::LaunchOptions o;
  o.num_processes = 2;
  o.timeout_s = 120;
  o.env["HASTEN_HOME"] = home.path().string();
  o.env["HASTEN_TIMEOUT_S"] = "60";
  return o;
}

Options with_strategy(const std::string& strategy) {
  Options o;
  o.strategy = strategy;
  return o;
}

// The full a and b of a prepared regression model, on every rank (get_state_dict is a
// collective under sharding and gives the tensors on the main process only).
template <class M>
std::pair<double, double> weights(Accelerator& acc, const M& model) {
  auto state = acc.get_state_dict(model);
  torch::Tensor ab = torch::zeros({2});
  if (acc.is_main_process())
    for (auto& [name, t] : state) ab[name == "a" ? 0 : 1] = t.reshape({}).to(torch::kFloat);
  ab = acc.broadcast(ab, 0);
  return {ab[0].item<double>(), ab[1].item<double>()};
}

// torch.testing.assert_close with Accelerate's tolerances (atol = rtol = 1e-6).
bool within_tolerance(double got, double want, double tol = 1e-6) {
  return std::abs(got - want) <= tol + tol * std::abs(want);
}

class Parity : public ::testing::TestWithParam<std::string> {};

}  // namespace

// ---- test_sync.py ----------------------------------------------------------------------------

// test_dataloader_break, on 2 ranks: the gradient state names the innermost loader, its end, and
// no loader outside any loop.
TEST_P(Parity, DataloaderBreakFollowsTheInnermostLoader) {
  const std::string strategy = GetParam();
  hasten::launch(
      [strategy] {
        Accelerator acc(with_strategy(strategy));
        auto [first, second] =
            acc.prepare(hasten::DataLoader(regression_data(80), {16}), hasten::DataLoader(regression_data(96), {16}));
        require(acc.gradient_state().active_dataloader == -1 && !acc.gradient_state().in_dataloader,
                "no active loader before the loop");
        size_t it = 0, inner_batches = 0;
        for (auto& batch : first) {
          (void)batch;
          require(acc.gradient_state().active_dataloader == static_cast<int64_t>(first.index()), "the first loader");
          if (it < first.size() - 1) {
            require(!acc.gradient_state().end_of_dataloader, "not the end at " + std::to_string(it));
            if (it == 1) {
              size_t inner = 0;
              for (auto& b : second) {
                (void)b;
                require(acc.gradient_state().active_dataloader == static_cast<int64_t>(second.index()),
                        "the inner loader");
                require(acc.gradient_state().end_of_dataloader == (inner == second.size() - 1),
                        "the inner loader's end at " + std::to_string(inner));
                ++inner;
              }
              inner_batches = inner;
              require(acc.gradient_state().active_dataloader == static_cast<int64_t>(first.index()),
                      "the outer loader again after the inner loop");
            }
          } else {
            require(acc.gradient_state().end_of_dataloader, "the end at the last batch");
          }
          ++it;
        }
        // 80 samples, 16 per rank: 3 rounds (the last padded); 96: 3 rounds.
        require(it == 3 && inner_batches == 3,
                "batches per rank: " + std::to_string(it) + ", " + std::to_string(inner_batches));
        require(acc.gradient_state().active_dataloader == -1, "no active loader after the loop");
      },
      two_ranks());
}

namespace {

// The single-process truth of test_sync.py: a plain copy trained on the gathered batch.
struct Truth {
  Regression model;
  void backward(const torch::Tensor& x, const torch::Tensor& y, double divisor) {
    (F::mse_loss(model(x), y) / divisor).backward();
  }
  torch::Tensor grad() const { return torch::cat({model->a.grad(), model->b.grad()}); }
};

struct OptSchedCase {
  bool split_batches = false;
  bool sync_each_batch = false;
  bool dispatch_batches = false;
};

// test_gradient_accumulation_with_opt_and_scheduler in every combination Accelerate runs (of
// split_batches, dispatch_batches and sync_each_batch): AdamW and LambdaLR (epoch^0.65)
// under accumulate over 2 micro-batches, in Accelerate's arithmetic (the loss divided by 2 in
// every window, the schedule stepped num_processes times per optimizer step unless
// split_batches). After each micro-batch: the learning rates agree, and the gradients equal the
// truth's exactly when Accelerate says they are in sync (on an optimizer step, or on every
// micro-batch with sync_each_batch) and differ otherwise; at the end the weights agree.
// The gradients are compared right after backward: the optimizer step leaves them as they are,
// and under zero they live in shards, so the comparison is of the global norm (clip_grad_norm_
// with no limit), plus every element under ddp.
void opt_sched_case(const std::string& strategy, OptSchedCase c) {
  hasten::launch(
      [strategy, c] {
        Options o = with_strategy(strategy);
        o.gradient_accumulation_steps = 2;
        o.split_batches = c.split_batches;
        o.sync_each_batch = c.sync_each_batch;
        o.dispatch_batches = c.dispatch_batches;  // rank 0 reads, every rank gets its rows
        o.scheduler_steps_per_process = true;
        o.short_window_loss_division = "steps";
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
        require(n == (c.split_batches ? 5 : 3), "batches per rank: " + std::to_string(n));
        const int sched_steps = c.split_batches ? 1 : acc.num_processes();
        int64_t it = 0;
        for (auto& batch : loader) {
          const bool did_step = (it + 1) % 2 == 0 || it + 1 == n;
          const std::string where = "micro-batch " + std::to_string(it);
          truth.backward(acc.gather(batch.input), acc.gather(batch.target), 2);
          {
            auto scope = acc.accumulate(model);
            acc.backward(F::mse_loss(model(batch.input), batch.target));
            const bool in_sync = did_step || c.sync_each_batch;
            const double norm = acc.clip_grad_norm_(model, 1e30);
            const double want = truth.grad().norm().item<double>();
            require((std::abs(norm - want) <= 1e-5 * (1 + want)) == in_sync,
                    where + ": gradient norm " + std::to_string(norm) + " vs the truth's " + std::to_string(want) +
                        (in_sync ? " (should be in sync)" : " (should not be)"));
            if (strategy == "ddp") {
              auto mine = torch::cat({net->a.grad(), net->b.grad()});
              require(torch::allclose(mine, truth.grad(), 1e-5, 1e-6) == in_sync,
                      where + ": gradient " + str(mine) + " vs the truth's " + str(truth.grad()));
            }
            popt.step();
            psched.step();
            popt.zero_grad();
          }
          if (did_step) {
            opt.step();
            for (int k = 0; k < sched_steps; ++k) sched.step();
            opt.zero_grad();
          }
          const double lr = opt.param_groups()[0].options().get_lr();
          const double plr = acc_opt.param_groups()[0].options().get_lr();
          require(lr == plr, where + ": learning rates " + std::to_string(lr) + " vs " + std::to_string(plr));
          ++it;
        }
        require(acc_sched.last_step() == sched_steps * (c.split_batches ? 3 : 2),
                "scheduler steps: " + std::to_string(acc_sched.last_step()));
        const auto [a, b] = weights(acc, model);
        // test_sync.cpp's tolerance: AdamW's steps add the ranks' terms in another order.
        auto near = [](double got, double want) { return std::abs(got - want) <= 1e-5 + 1e-4 * std::abs(want); };
        require(near(a, truth.model->a.item<double>()) && near(b, truth.model->b.item<double>()),
                "weights " + std::to_string(a) + ", " + std::to_string(b) + " vs the truth's " + str(truth.model->a) +
                    ", " + str(truth.model->b));
      },
      two_ranks());
}

}  // namespace

TEST_P(Parity, OptimizerAndSchedulerUnderAccumulation) { opt_sched_case(GetParam(), {false, false}); }
TEST_P(Parity, OptimizerAndSchedulerUnderAccumulationWithSyncEachBatch) { opt_sched_case(GetParam(), {false, true}); }
TEST_P(Parity, OptimizerAndSchedulerUnderAccumulationWithSplitBatches) { opt_sched_case(GetParam(), {true, false}); }
TEST_P(Parity, OptimizerAndSchedulerUnderAccumulationWithSplitBatchesAndSyncEachBatch) {
  opt_sched_case(GetParam(), {true, true});
}
TEST_P(Parity, OptimizerAndSchedulerUnderAccumulationWithDispatchBatches) {
  opt_sched_case(GetParam(), {false, false, true});
}
TEST_P(Parity, OptimizerAndSchedulerUnderAccumulationWithDispatchBatchesAndSyncEachBatch) {
  opt_sched_case(GetParam(), {false, true, true});
}
TEST_P(Parity, OptimizerAndSchedulerUnderAccumulationWithDispatchAndSplitBatches) {
  opt_sched_case(GetParam(), {true, false, true});
}
TEST_P(Parity, OptimizerAndSchedulerUnderAccumulationWithDispatchAndSplitBatchesAndSyncEachBatch) {
  opt_sched_case(GetParam(), {true, true, true});
}

// test_gradient_accumulation with split_batches and sync_each_batch (the other combinations
// without dispatch_batches are in test_sync.cpp): every micro-batch reduces, and the gradients
// are the truth's on every one.
TEST_P(Parity, AccumulateWithSplitBatchesAndSyncEachBatchReducesEveryMicroBatch) {
  const std::string strategy = GetParam();
  hasten::launch(
      [strategy] {
        Options o = with_strategy(strategy);
        o.gradient_accumulation_steps = 2;
        o.split_batches = true;
        o.sync_each_batch = true;
        Accelerator acc(o);
        Truth truth{Regression()};
        Regression net;
        auto [model, loader] = acc.prepare(net, hasten::DataLoader(regression_data(80), {16}));
        const int64_t n = static_cast<int64_t>(loader.size());
        require(n == 5, "5 batches of 8 per rank");
        int64_t it = 0;
        for (auto& batch : loader) {
          const bool last = it == n - 1;
          truth.backward(acc.gather(batch.input), acc.gather(batch.target), last ? 1 : 2);  // hasten's mean
          auto scope = acc.accumulate(model);
          acc.backward(F::mse_loss(model(batch.input), batch.target));
          require(acc.sync_gradients() == ((it + 1) % 2 == 0 || last), "sync_gradients at " + std::to_string(it));
          const double norm = acc.clip_grad_norm_(model, 1e30);
          const double want = truth.grad().norm().item<double>();
          require(std::abs(norm - want) <= 1e-5 * (1 + want), "micro-batch " + std::to_string(it) + ": gradient norm " +
                                                                  std::to_string(norm) + " vs " + std::to_string(want));
          ++it;
        }
      },
      two_ranks());
}

// ---- test_script.py --------------------------------------------------------------------------

namespace {

// mock_training: one process, plain LibTorch, 3 epochs over the global order a hasten loader
// with shuffle and `seed` deals, in batches of `global_batch`, SGD(0.1).
std::pair<double, double> single_process_training(const hasten::TensorDataset& data, int64_t global_batch,
                                                  uint64_t seed) {
  Regression model;
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  const int64_t n = static_cast<int64_t>(data.size());
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const auto order = hasten::RandomSampler(n, seed).indices(epoch);
    for (int64_t start = 0; start < n; start += global_batch) {
      std::vector<int64_t> idx(order.begin() + start, order.begin() + std::min(n, start + global_batch));
      auto batch = data.get_batch(idx);
      model->zero_grad();
      F::mse_loss(model(batch.input), batch.target).backward();
      sgd.step();
    }
  }
  return {model->a.item<double>(), model->b.item<double>()};
}

}  // namespace

// training_check: the same regression trained on 2 ranks (batch 8 each; then split_batches with
// the global batch 16; then under bf16 and fp16) ends where one process trained on batches of 16 ends,
// within Accelerate's tolerance (1e-6). Each rank computes the single-process run itself, and the
// ranks' results must agree (Accelerate's are_the_same_tensors on the baseline).
TEST_P(Parity, TrainingMatchesOneProcessWithAndWithoutSplitBatchesAndInBf16AndFp16) {
  const std::string strategy = GetParam();
  hasten::launch(
      [strategy] {
        const int64_t batch_size = 8, length = batch_size * 4 * 2;
        const auto data = regression_data(length);
        const auto [ra, rb] = single_process_training(data, batch_size * 2, 42);
        auto baseline = Accelerator(with_strategy(strategy)).gather(torch::tensor({{ra, rb}}));
        require(torch::equal(baseline[0], baseline[1]),
                "the single-process run differs between ranks: " + str(baseline));
        require(ra > 1.5 && rb > 2.5, "the single-process run did not train: a " + std::to_string(ra));
        struct Variant {
          std::string name;
          bool split;
          std::string precision;
        };
        for (const Variant& v : {Variant{"no split", false, "no"}, Variant{"split_batches", true, "no"},
                                 Variant{"bf16", false, "bf16"}, Variant{"fp16", false, "fp16"}}) {
          Options o = with_strategy(strategy);
          o.split_batches = v.split;
          o.mixed_precision = v.precision;
          // Departure: fp16 on a CPU is refused unless asked for (LibTorch 1.13 has no CPU fp16
          // autocast, so only the loss scaler runs); Accelerate trains in fp16 on a CPU as is.
          // The refusal is Precision.Fp16OnACpuRunIsAClearError in test_accelerator.cpp.
          if (v.precision == "fp16") o.set = {{"precision_options", "{cpu_scaler_only: true}"}};
          Accelerator acc(o);
          auto net = std::make_shared<RegressionImpl>();  // model->zero_grad() below reaches it
          torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
          const int64_t bs = v.split ? batch_size * 2 : batch_size;
          auto [loader, model, opt] =
              acc.prepare(hasten::DataLoader(data, {.batch_size = bs, .shuffle = true, .seed = 42}), net, sgd);
          for (int epoch = 0; epoch < 3; ++epoch)
            for (auto& batch : loader) {
              model->zero_grad();
              acc.backward(F::mse_loss(model(batch.input), batch.target));
              opt.step();
            }
          const auto [a, b] = weights(acc, model);
          require(within_tolerance(a, ra) && within_tolerance(b, rb),
                  strategy + ", " + v.name + ": a " + std::to_string(a) + " vs " + std::to_string(ra) + ", b " +
                      std::to_string(b) + " vs " + std::to_string(rb));
        }
      },
      two_ranks());
}

// dl_preparation_check: 64 samples in batches of 8 per rank (or a global 8 split), in order and
// shuffled: the batches gathered one by one are the dataset, in order when not shuffled.
// check_seedable_sampler: the same seed and epoch give the same items (set_epoch(0) after three
// epochs repeats them); check_seedable_sampler_with_data_seed: another seed, other items; and
// every rank's share is its slice of RandomSampler(n, seed)'s order (what Accelerate checks
// by the type of the sampler inside BatchSamplerShard).
TEST(ParityLoaders, PreparedLoadersDealTheDatasetAndTheirSeedDecidesTheOrder) {
  hasten::launch(
      [] {
        Accelerator acc;
        const int64_t length = 32 * 2;
        for (bool shuffle : {false, true})
          for (bool split : {false, true}) {
            const std::string what = std::string(shuffle ? "shuffled" : "in order") + (split ? ", split" : "");
            hasten::DataLoader data(numbers(length),
                                    {.batch_size = 8, .shuffle = shuffle, .seed = 3, .split_batches = split});
            auto loader = acc.prepare(data);
            std::vector<torch::Tensor> parts;
            for (auto& batch : loader) parts.push_back(acc.gather(batch.input));
            auto got = to_vector(torch::cat(parts));
            if (shuffle) {
              require(got == to_vector(torch::tensor(hasten::RandomSampler(length, 3).indices(0))),
                      what + ": the global order of seed 3, epoch 0");
              std::sort(got.begin(), got.end());
            }
            require(got == to_vector(torch::arange(length)), what + ": got " + str(torch::tensor(got)));
          }
        auto items = [&acc](uint64_t seed, bool repeat) {
          hasten::DataLoader data(regression_data(10), {.batch_size = 2, .shuffle = true, .seed = seed});
          auto loader = acc.prepare(data);
          std::vector<torch::Tensor> first, again;
          for (int epoch = 0; epoch < 3; ++epoch)
            for (auto& batch : loader) {
              first.push_back(batch.input);
              // The rank's share of round k: its slice of the epoch's order.
              const auto order = hasten::RandomSampler(10, seed).indices(epoch);
              const auto pos = (static_cast<int64_t>(first.size() - 1) % 3 * 2 + acc.process_index()) * 2;
              const auto idx = to_vector(batch.indices);
              require(idx.size() == 2 && idx[0] == order[pos % 10] && idx[1] == order[(pos + 1) % 10],
                      "the share of rank " + std::to_string(acc.process_index()));
            }
          if (repeat) {
            loader.set_epoch(0);
            for (int epoch = 0; epoch < 3; ++epoch)
              for (auto& batch : loader) again.push_back(batch.input);
            require(torch::equal(torch::cat(first), torch::cat(again)), "set_epoch(0) repeats the items");
          }
          return torch::cat(first);
        };
        auto seed42 = items(42, true);
        auto seed43 = items(43, false);
        require(!torch::allclose(seed42, seed43), "another data seed gave the same items");
        acc.wait_for_everyone();
      },
      two_ranks());
}

// test_trigger on 2 ranks: false at first, true on every rank once the main process set it,
// false again after that check.
TEST(ParityScript, TriggerIsSeenByEveryRankAndResets) {
  hasten::launch(
      [] {
        Accelerator acc;
        require(!acc.check_trigger(), "the trigger starts unset");
        if (acc.is_main_process()) acc.set_trigger();
        require(acc.check_trigger(),
                "rank " + std::to_string(acc.process_index()) + " sees the main process's trigger");
        require(!acc.check_trigger(), "the check reset the trigger");
      },
      two_ranks());
}

// ---- test_distributed_data_loop.py ------------------------------------------------------------

// test_default_ensures_even_batch_sizes and test_can_disable_even_batches: the batch sizes each
// rank gets (padding counted) for 3 samples in batches of 1 and 7 in batches of 2.
TEST(ParityLoaders, EvenBatchesDecideEachRanksBatchSizes) {
  hasten::launch(
      [] {
        for (bool even : {true, false}) {
          Options o;
          o.even_batches = even;
          Accelerator acc(o);
          const int r = acc.process_index();
          auto sizes = [&acc](int64_t n, int64_t bs) {
            hasten::DataLoader data(numbers(n), {.batch_size = bs});
            auto loader = acc.prepare(data);
            std::vector<int64_t> out;
            for (auto& batch : loader) out.push_back(batch.input.size(0));
            return out;
          };
          const auto three = sizes(3, 1), seven = sizes(7, 2);
          const std::string what = std::string(even ? "even" : "uneven") + ", rank " + std::to_string(r);
          if (even) {
            require(three == std::vector<int64_t>{1, 1}, what + ": 3 in batches of 1");
            require(seven == std::vector<int64_t>{2, 2}, what + ": 7 in batches of 2");
          } else {
            require(three == (r == 0 ? std::vector<int64_t>{1, 1} : std::vector<int64_t>{1}),
                    what + ": 3 in batches of 1");
            require(seven == (r == 0 ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{2, 1}),
                    what + ": 7 in batches of 2");
          }
          acc.wait_for_everyone();
        }
      },
      two_ranks());
}

// test_join_can_override_even_batches, test_join_can_override_for_mixed_type_dataloaders and
// test_join_raises_warning_for_iterable_when_overriding_even_batches: inside the scope both
// map-style loaders are uneven, after it even again; with a stream loader prepared too the
// override still reaches the map-style ones, and the main process warns that it does not reach
// the stream (Accelerate warns the same).
TEST(ParityJoin, JoinOverridesEvenBatchesOfMapStyleLoadersAndWarnsAboutStreams) {
  hasten::launch(
      [] {
        Accelerator acc(with_strategy("ddp"));
        std::ostringstream log;
        auto sink = std::make_shared<hasten::OstreamSink>(log);
        hasten::get_logger()->add_sink(sink);
        const bool first = acc.process_index() == 0;
        torch::nn::Linear net(1, 1);
        auto model = acc.prepare(net);
        auto [train, valid] = acc.prepare(hasten::DataLoader(numbers(3), {1}), hasten::DataLoader(numbers(3), {1}));
        hasten::JoinOptions uneven;
        uneven.even_batches = false;
        {
          auto join = acc.join_uneven_inputs({model}, uneven);
          require(train.size() == (first ? 2u : 1u) && valid.size() == (first ? 2u : 1u),
                  "inside the scope: " + std::to_string(train.size()) + ", " + std::to_string(valid.size()));
        }
        require(train.size() == 2u && valid.size() == 2u, "the default is back after the scope");
        require(log.str().find("stream") == std::string::npos, "a warning without any stream loader: " + log.str());
        auto stream = acc.prepare(hasten::DataLoader(Stream{.n = 3}, {1}));
        {
          auto join = acc.join_uneven_inputs({model}, uneven);
          require(train.size() == (first ? 2u : 1u), "with a stream loader too, the map-style one is overridden");
          size_t batches = 0;
          for (auto& b : stream) (void)b, ++batches;
          require(batches == 2, "the stream keeps its completed rounds: " + std::to_string(batches));
        }
        require(train.size() == 2u, "the default is back after the second scope");
        if (first)
          require(log.str().find("join_uneven_inputs: overriding even_batches applies to loaders over map-style "
                                 "datasets only; loader 2 reads a stream dataset") != std::string::npos,
                  "the warning: '" + log.str() + "'");
        else
          require(log.str().empty(), "only the main process warns: '" + log.str() + "'");
        hasten::get_logger()->remove_sink(sink);
        acc.wait_for_everyone();
      },
      two_ranks());
}

// test_stateful_dataloader: a loader's own state_dict, taken at step 2 of an epoch and loaded
// after the epoch, makes the next iteration yield exactly the batches after step 2 (a shuffled
// map-style loader and a stream loader, every rank's batches gathered); inside a loop
// load_state_dict is refused with one line.
TEST(ParityLoaders, AStateDictTakenMidEpochResumesAfterTheBatchYielded) {
  hasten::launch(
      [] {
        Accelerator acc;
        hasten::DataLoader shuffled(numbers(64), {.batch_size = 4, .shuffle = true, .seed = 7});
        hasten::DataLoader streamed(Stream{.n = 64}, {.batch_size = 4});
        auto [a, b] = acc.prepare(shuffled, streamed);
        auto check = [&acc](auto& loader, const std::string& what) {
          hasten::LoaderState saved;
          std::vector<torch::Tensor> unseen, resumed;
          int step = 0;
          for (auto& batch : loader) {
            if (step == 2) {
              saved = loader.state_dict();
              try {
                loader.load_state_dict(saved);
                require(false, what + ": load_state_dict inside the loop was accepted");
              } catch (const hasten::UsageError& e) {
                require(std::string(e.what()).find("while this loader is being iterated") != std::string::npos,
                        e.what());
              }
            }
            if (step > 2) unseen.push_back(acc.gather(batch.input));
            ++step;
          }
          require(saved == hasten::LoaderState{0, 3}, what + ": the state at step 2 is epoch " +
                                                          std::to_string(saved.epoch) + ", batch " +
                                                          std::to_string(saved.next_batch));
          require(loader.state_dict() == hasten::LoaderState{1, 0}, what + ": after the epoch, the next one's start");
          loader.load_state_dict(saved);
          for (auto& batch : loader) resumed.push_back(acc.gather(batch.input));
          require(unseen.size() == 5 && resumed.size() == unseen.size(), what + ": " + std::to_string(resumed.size()) +
                                                                             " batches after the resume, " +
                                                                             std::to_string(unseen.size()) + " unseen");
          for (size_t i = 0; i < unseen.size(); ++i)
            require(torch::equal(unseen[i], resumed[i]),
                    what + ": batch " + std::to_string(i) + " " + str(resumed[i]) + " vs " + str(unseen[i]));
        };
        check(a, "shuffled");
        check(b, "stream");
        try {
          a.load_state_dict({-1, 0});
          require(false, "a negative epoch was accepted");
        } catch (const hasten::UsageError& e) {
          require(
              std::string(e.what()) == "load_state_dict: the epoch and the batch must be >= 0, got epoch -1, batch 0",
              e.what());
        }
      },
      two_ranks());
}

// ---- external_deps/test_metrics.py -------------------------------------------------------

// test_torch_metrics (99 samples with and without split_batches, 512 samples) and
// test_gather_for_metrics_drop_last: an evaluation of a prepared model gathers exactly the
// dataset's samples, in order (the outputs are checked against the model's formula, not only
// counted as Accelerate does); with drop_last, each batch gathered whole.
TEST_P(Parity, GatherForMetricsReturnsEverySampleOfAnEvaluation) {
  const std::string strategy = GetParam();
  hasten::launch(
      [strategy] {
        struct Run {
          int64_t samples;
          bool split;
        };
        for (const Run& run : {Run{99, false}, Run{99, true}, Run{512, false}}) {
          Options o = with_strategy(strategy);
          o.split_batches = run.split;
          Accelerator acc(o);
          Regression net(1.5, -0.5);
          const auto data = regression_data(run.samples);
          auto [model, loader] = acc.prepare(net, hasten::DataLoader(data, {16}));
          std::vector<torch::Tensor> logits, targets;
          {
            torch::NoGradGuard no_grad;
            for (auto& batch : loader) {
              auto out = acc.gather_for_metrics(std::make_tuple(model(batch.input), batch.target));
              logits.push_back(std::get<0>(out));
              targets.push_back(std::get<1>(out));
            }
          }
          auto all_logits = torch::cat(logits), all_targets = torch::cat(targets);
          const std::string what = strategy + ", " + std::to_string(run.samples) + (run.split ? " split" : "");
          require(all_logits.size(0) == run.samples, what + ": " + std::to_string(all_logits.size(0)) + " outputs");
          require(torch::allclose(all_logits, data.inputs() * 1.5 - 0.5), what + ": the outputs in dataset order");
          require(torch::equal(all_targets, data.targets()), what + ": the targets in dataset order");
        }
        Accelerator acc(with_strategy(strategy));
        hasten::DataLoader data(numbers(10 * 2 + 1), {.batch_size = 5, .drop_last = true});
        auto loader = acc.prepare(data);
        int64_t k = 0;
        std::vector<int64_t> all;
        for (auto& batch : loader) {
          auto gathered = acc.gather_for_metrics(batch.input);
          if (k++ == 1) require(gathered.size(0) == 5 * 2, "the second batch: " + std::to_string(gathered.size(0)));
          for (auto i : to_vector(gathered)) all.push_back(i);
        }
        require(k == 2 && all == to_vector(torch::arange(20)),
                "drop_last: the 21st sample dropped, got " + str(torch::tensor(all)));
      },
      two_ranks());
}

// test_gather_for_metrics_with_iterable_dataset and ..._with_non_tensor_objects_iterable_dataset
// (Accelerate runs them off CPU only; nothing here depends on the device): 30 samples of a stream
// in batches of 4, gathered batch by batch as tensors and as plain values, are the 30 samples once
// each, and no warning is logged.
TEST(ParityMetrics, GatherForMetricsOverAStreamCountsEachSampleOnceWithoutAWord) {
  hasten::launch(
      [] {
        Accelerator acc;
        std::ostringstream log;
        auto sink = std::make_shared<hasten::OstreamSink>(log);
        sink->set_level(hasten::LogLevel::warn);  // Accelerate's check: no warning
        hasten::get_logger()->add_sink(sink);
        hasten::get_logger("hasten", false)->add_sink(sink);
        auto loader = acc.prepare(hasten::DataLoader(Stream{.n = 30}, {4}));
        std::vector<torch::Tensor> tensors;
        std::vector<int64_t> values;
        for (auto& batch : loader) {
          tensors.push_back(acc.gather_for_metrics(batch.input));
          const auto mine = to_vector(batch.input);
          for (auto v : acc.gather_for_metrics(mine)) values.push_back(v);
        }
        auto all = to_vector(torch::cat(tensors));
        require(all.size() == 30, "tensors: " + std::to_string(all.size()) + " samples");
        std::sort(all.begin(), all.end());
        require(all == to_vector(torch::arange(30)), "tensors: each sample once");
        std::sort(values.begin(), values.end());
        require(values == to_vector(torch::arange(30)), "values: " + std::to_string(values.size()) + " samples");
        hasten::get_logger()->remove_sink(sink);
        hasten::get_logger("hasten", false)->remove_sink(sink);
        require(log.str().empty(), "logged: '" + log.str() + "'");
      },
      two_ranks());
}

// ---- test_ops.py -------------------------------------------------------------------------------

// test_op_checker's pad_across_processes case: in debug mode, a map holding tensors of 2 and 3
// dimensions is refused on every rank (reduce and broadcast are in test_object_collectives.cpp).
TEST(ParityOps, DebugModeRefusesPaddingTensorsOfDifferentDimensions) {
  auto opts = two_ranks();
  opts.env["HASTEN_DEBUG"] = "1";
  hasten::launch(
      [] {
        Accelerator acc;
        std::map<std::string, torch::Tensor> data{{"tensor", acc.process_index() == 0
                                                                 ? torch::arange(5, torch::kFloat).view({1, 5})
                                                                 : torch::arange(6, torch::kFloat).view({1, 1, 6})}};
        try {
          acc.pad_across_processes(data, 0);
          require(false, "tensors of 2 and 3 dimensions were padded");
        } catch (const hasten::UsageError& e) {
          require(std::string(e.what()).find("(rank 0: 2, rank 1: 3)") != std::string::npos, e.what());
        }
        acc.wait_for_everyone();  // rank 0 hosts the store the check reads
      },
      opts);
}

INSTANTIATE_TEST_SUITE_P(Strategies, Parity, ::testing::Values("ddp", "zero2", "zero3"));

}  // namespace accelerate_parity_tests
