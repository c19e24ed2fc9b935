// hasten::schedulers prepared by an Accelerator: the schedule advances once per real optimizer
// step under accumulation, a checkpoint resumes it where it stopped, and OneCycleLR follows
// Accelerate's step bound and adjust_scheduler. (The schedules themselves:
// tests/unit/schedulers/test_schedules.cpp.)
#include <hasten/accelerator.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <optional>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "test_util.hpp"
#include "schedulers/schedule_reference.hpp"

namespace fs = std::filesystem;
namespace S = hasten::schedulers;
using hasten::Accelerator;
using hasten::Options;
using namespace hasten::test::schedules;

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

// A linear layer, an optimizer of two groups and `Scheduler` on it, prepared by an Accelerator;
// micro_batch() is one micro-batch of the user's loop (its scheduler step may throw).
template <class Scheduler>
struct Prepared {
  Prepared(Options options, const std::string& optimizer, const std::function<Scheduler(torch::optim::Optimizer&)>& schedule)
      : acc(std::move(options)), t(optimizer), sched(schedule(*t.opt)) {
    auto [m, o, s] = acc.prepare(t.net, *t.opt, sched);
    model = std::make_unique<hasten::PreparedModel<torch::nn::Linear>>(m);
    opt = std::make_unique<hasten::PreparedOptimizer>(o);
    prepared = std::make_unique<hasten::PreparedScheduler<Scheduler>>(s);
  }
  void micro_batch() {
    auto scope = acc.accumulate(*model);
    acc.backward((*model)(torch::ones({3, 4})).pow(2).sum());
    opt->step();
    prepared->step();
    opt->zero_grad();
  }

  Accelerator acc;
  TwoGroups t;
  Scheduler sched;
  std::unique_ptr<hasten::PreparedModel<torch::nn::Linear>> model;
  std::unique_ptr<hasten::PreparedOptimizer> opt;
  std::unique_ptr<hasten::PreparedScheduler<Scheduler>> prepared;
};

// SGD with two groups, a cosine schedule, accumulation 2.
struct PreparedRun : Prepared<S::LambdaLR> {
  static constexpr int64_t kWarmup = 2, kTotal = 9;
  explicit PreparedRun(const fs::path& project)
      : Prepared(isolated(project), "sgd", [](auto& o) { return S::cosine_with_warmup(o, kWarmup, kTotal); }) {}
  static double factor(int64_t k) { return ref::cosine(k, kWarmup, kTotal, 0.5); }
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

// ---- OneCycleLR prepared: Accelerate's bound and adjust_scheduler ---------------------------

namespace {

// One process, accumulation 2, a OneCycleLR of total_steps 4 whose prepared step() is called
// on every micro-batch (Accelerate's loop). Returns last_step() after each of `micro` micro-
// batches, stopping at the first error (its message in *error).
struct OneCycleRun : Prepared<S::OneCycleLR> {
  OneCycleRun(const fs::path& project, std::optional<bool> per_process, std::optional<bool> adjust)
      : Prepared(options(project, per_process, adjust), "adamw",
                 [](auto& o) { return S::OneCycleLR(o, std::vector<double>{kLrA, kLrB}, 4); }) {}
  static Options options(const fs::path& project, std::optional<bool> per_process, std::optional<bool> adjust) {
    Options o = isolated(project);
    o.scheduler_steps_per_process = per_process;
    o.adjust_scheduler = adjust;
    return o;
  }
  std::vector<int64_t> run(int micro, std::string* error = nullptr) {
    std::vector<int64_t> steps;
    for (int n = 0; n < micro; ++n) {
      try {
        micro_batch();
      } catch (const hasten::Error& e) {
        if (error) *error = e.what();
        break;
      }
      steps.push_back(sched.last_step());
      // The lrs are the schedule's at that step (a bound stops it, it does not skew it).
      EXPECT_DOUBLE_EQ(t.lrs()[0], (ref::OneCycleRef{kLrA, 4}.at(sched.last_step()).first));
    }
    return steps;
  }
};

}  // namespace

TEST(Schedulers, OneCycleHastenDefaultStepsPerOptimizerStepPastTotalIsAnError) {
  hasten::test::TempDir dir;
  OneCycleRun r(dir.path(), std::nullopt, std::nullopt);
  EXPECT_FALSE(r.acc.gradient_state().adjust_scheduler);
  std::string error;
  EXPECT_EQ(r.run(10, &error), (std::vector<int64_t>{0, 1, 1, 2, 2, 3, 3, 4, 4}));
  EXPECT_EQ(error, "OneCycleLR: tried to step 5 times; the specified number of total steps is 4");
}

// Accelerate's AcceleratedScheduler steps a schedule with total_steps only while its
// _step_count (1 + steps + adjust_scheduler's micro-batches) <= total_steps. With
// adjust_scheduler (Accelerate's default) each accumulation micro-batch counts, so the
// k-th optimizer step (micro-batch 2k) steps only while 2k <= 4: the schedule stops at 2.
TEST(Schedulers, OneCycleAccelerateArithmeticWithAdjustSchedulerCountsMicroBatches) {
  hasten::test::TempDir dir;
  OneCycleRun r(dir.path(), true, std::nullopt);
  EXPECT_TRUE(r.acc.gradient_state().adjust_scheduler);
  EXPECT_EQ(r.run(10), (std::vector<int64_t>{0, 1, 1, 2, 2, 2, 2, 2, 2, 2}));
}

// adjust_scheduler false: only real steps count; the bound stops the schedule at total_steps
// instead of the error of stepping past it.
TEST(Schedulers, OneCycleAccelerateArithmeticWithoutAdjustSchedulerStopsAtTotal) {
  hasten::test::TempDir dir;
  OneCycleRun r(dir.path(), true, false);
  EXPECT_FALSE(r.acc.gradient_state().adjust_scheduler);
  EXPECT_EQ(r.run(10), (std::vector<int64_t>{0, 1, 1, 2, 2, 3, 3, 4, 4, 4}));
}

// A checkpoint keeps the micro-batches adjust_scheduler counted: resumed after 3 micro-batches
// (1 step, 2 counted), the schedule stops where the uninterrupted run's does (without them,
// micro-batch 6 would step to 3).
TEST(Schedulers, OneCycleCheckpointKeepsAdjustSchedulersCount) {
  hasten::test::TempDir dir;
  const std::string ckpt = (dir.path() / "ckpt").string();
  {
    OneCycleRun r(dir.path(), true, std::nullopt);
    EXPECT_EQ(r.run(3), (std::vector<int64_t>{0, 1, 1}));
    r.acc.save_state(ckpt);
  }
  OneCycleRun resumed(dir.path(), true, std::nullopt);
  resumed.acc.load_state(ckpt);
  EXPECT_EQ(resumed.sched.last_step(), 1);
  EXPECT_EQ(resumed.run(7), (std::vector<int64_t>{2, 2, 2, 2, 2, 2, 2}));
}

TEST(Schedulers, AdjustSchedulerWithoutAccelerateArithmeticIsRefused) {
  hasten::test::TempDir dir;
  try {
    OneCycleRun r(dir.path(), std::nullopt, false);
    FAIL() << "adjust_scheduler without scheduler_steps_per_process was accepted";
  } catch (const hasten::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "config error: adjust_scheduler (code) applies only with "
              "scheduler_steps_per_process: true (Accelerate's scheduler arithmetic, whose step bound it adjusts); "
              "hasten's default schedule steps once per optimizer step and has no bound to adjust: set "
              "scheduler_steps_per_process: true, or remove adjust_scheduler");
  }
}
