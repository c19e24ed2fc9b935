// The config key `profile`: LibTorch's (Kineto) profiler over a window of optimizer steps, on
// every rank, one Chrome trace per rank that Perfetto and TensorBoard's trace viewer open.
// hasten's phases are named user-scope ranges in it (TraceRange, util/trace_ranges.hpp, in the
// core; RECORD_USER_SCOPE in the header templates prepared_model.hpp and batch_iterators.hpp):
// hasten::forward, hasten::backward, hasten::optimizer_step, hasten::data_wait, each collective
// the host issues (hasten::allreduce, ...) and its wait (hasten::wait), hasten::save_state and
// hasten::load_state. They appear in any LibTorch profile, a program's own too.
//
// Steps are the optimizer steps of the first prepared optimizer, counted from 0. At the start
// of step `wait` the profiler is prepared (warmup steps run it and are dropped, as
// torch.profiler.schedule's), at step wait + warmup it records, and after `active` steps it
// stops and writes <dir>/<host>_rank<R>.pt.trace.json (the name TensorBoard's PyTorch profiler
// plugin lists). A run that ends inside the window writes what it recorded.
#include <hasten/error.hpp>
#include <hasten/logging.hpp>

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <unistd.h>

#include <filesystem>
#include <optional>

#include "engine/engine_state.hpp"
#include "util/trace_ranges.hpp"

namespace hasten::detail {

namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// hasten's ranges in any LibTorch profile, this one's or one the program runs itself: the
// functions are installed when libhasten loads, and cost nothing while no profiler listens.
void* begin_range(const char* name) {
  if (!at::hasCallbacks()) return nullptr;
  auto* range = new at::RecordFunction(at::RecordScope::USER_SCOPE);
  if (range->isActive()) range->before(name);
  return range;
}

void end_range(void* handle) { delete static_cast<at::RecordFunction*>(handle); }

const bool kRangesInstalled = [] {
  set_trace_ranges(begin_range, end_range);
  return true;
}();

ProfilerConfig kineto_config() { return ProfilerConfig(ProfilerState::KINETO); }

// torch.profiler's step markers: TensorBoard's profile plugin cuts a trace into steps at the
// ranges named ProfilerStep#N, each from one optimizer step's end to the next one's. Ends the
// open marker and, with a step number, opens the next.
void mark_step(void*& marker, std::optional<int64_t> step) {
  delete static_cast<at::RecordFunction*>(marker);
  marker = nullptr;
  if (!step) return;
  auto* range = new at::RecordFunction(at::RecordScope::USER_SCOPE);
  if (range->isActive()) range->before("ProfilerStep#" + std::to_string(*step));
  marker = range;
}

std::set<ActivityType> activities(const torch::Device& device) {
  std::set<ActivityType> a{ActivityType::CPU};
  if (device.is_cuda()) a.insert(ActivityType::CUDA);
  return a;
}

}  // namespace

void Engine::Impl::profile_tick() {
  ProfileWindow& w = profiling;
  const ProfileSettings& p = config.profile;
  if (!p.enabled || w.done) return;
  const int64_t start = p.wait + p.warmup, stop = start + p.active;
  try {
    if (w.step == p.wait && p.warmup > 0 && !w.prepared) {
      profiler::prepareProfiler(kineto_config(), activities(device));
      w.prepared = true;
    }
    if (w.step == start && !w.recording) {
      if (!w.prepared) profiler::prepareProfiler(kineto_config(), activities(device));
      profiler::enableProfiler(kineto_config(), activities(device), {at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE});
      w.recording = true;
      w.first = w.step;
    }
    if (w.step == stop && w.recording) profile_finish();
    else if (w.recording) mark_step(w.step_marker, w.step);
  } catch (const std::exception& e) {
    w.done = true;
    get_logger()->warn("profile: the profiler could not start or stop ({}); this run goes on without it", e.what());
  }
}

void Engine::profile(ProfileSettings window) {
  Impl& s = *impl_;
  const auto& w = s.profiling;
  if (s.config.profile.enabled && !w.done)
    throw UsageError("profile: a profiling window is open already (step " + std::to_string(w.step) + " of wait " +
                     std::to_string(s.config.profile.wait) + ", warmup " + std::to_string(s.config.profile.warmup) +
                     ", active " + std::to_string(s.config.profile.active) + "); call profile again after it ends");
  if (window.wait < 0 || window.warmup < 0 || window.active < 1)
    throw UsageError("profile: wait " + std::to_string(window.wait) + ", warmup " + std::to_string(window.warmup) +
                     ", active " + std::to_string(window.active) + " (allowed: wait and warmup >= 0, active >= 1)");
  window.enabled = true;
  if (window.dir.empty()) window.dir = s.config.profile.dir;  // the config key's dir, if it named one
  s.config.profile = window;
  const int windows = s.profiling.windows;
  s.profiling = {};  // counted from here
  s.profiling.windows = windows;
  s.profile_tick();
}

void Engine::Impl::profile_finish() noexcept {
  ProfileWindow& w = profiling;
  if (!w.recording || w.done) return;
  w.done = true;
  w.recording = false;
  try {
    mark_step(w.step_marker, std::nullopt);
    std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
    namespace fs = std::filesystem;
    const fs::path dir = config.profile.dir.empty() ? fs::path(config.project_dir) / "profile" : fs::path(config.profile.dir);
    fs::create_directories(dir);
    char host[256] = {0};
    ::gethostname(host, sizeof host - 1);
    // A later window of the same run (Accelerator::profile again) gets .2, .3, ... before the
    // suffix: TensorBoard's profile plugin reads the part before .pt.trace.json as the worker.
    const std::string stem = std::string(host) + "_rank" + std::to_string(process.rank);
    fs::path file = dir / (stem + ".pt.trace.json");
    for (int n = 2; fs::exists(file) && w.windows > 0; ++n) file = dir / (stem + "." + std::to_string(n) + ".pt.trace.json");
    ++w.windows;
    result->save(file.string());
    get_logger()->info("profile: steps {} to {} written to {}", w.first, w.step - 1, file.string());
  } catch (const std::exception& e) {
    get_logger()->warn("profile: writing the trace failed: {}", e.what());
  }
}

}  // namespace hasten::detail
