// The training run shared by hasten-example and hasten-bench: a workload through hasten or
// through a plain LibTorch loop, summarised like the PyTorch peer.
#include "runner.hpp"

#include <hasten/hasten.hpp>
#include <hasten/progress.hpp>
#include <hasten/runtime_info.hpp>
#include <hasten/torch_compat.hpp>

#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "workloads.hpp"

namespace hasten::examples {

namespace {

using Clock = std::chrono::steady_clock;

// Waits for what the host queued on a GPU, so that a clock read afterwards counts it.
void finish_device_work(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}
namespace W = hasten::workloads;


// Tests of automatic restart: HASTEN_TEST_KILL_AT_STEP=S kills rank HASTEN_TEST_KILL_RANK
// (default 1) with SIGKILL after step S, in the first attempt of a launch only. Tests of
// trackers against a server that goes away: HASTEN_TEST_STEP_DELAY_MS=D sleeps D ms after
// every step, so that a run lasts long enough to stop and restart the server under it.
void kill_for_tests(const hasten::Accelerator& acc, int64_t step) {
  if (const char* delay = std::getenv("HASTEN_TEST_STEP_DELAY_MS"))
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(delay)));
  const char* at = std::getenv("HASTEN_TEST_KILL_AT_STEP");
  if (at == nullptr || std::atoll(at) != step) return;
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (attempt != nullptr && std::string(attempt) != "0") return;
  const char* rank = std::getenv("HASTEN_TEST_KILL_RANK");
  if (acc.process_index() == (rank != nullptr ? std::atoi(rank) : 1)) ::raise(SIGKILL);
}

// The step count, saved in every checkpoint so that a resumed run knows where it is.
struct StepCounter {
  int64_t value = 0;
  std::string state_dict() const { return std::to_string(value); }
  void load_state_dict(const std::string& bytes) { value = std::stoll(bytes); }
};

struct Result {
  std::vector<double> losses;  // per step, averaged over ranks
  std::string param_checksum;  // SHA-256 of the final full parameters (hasten runs)
  int64_t resumed_at = -1;     // the step the run continued from (-1: it started fresh)
  double timed_s = 0;
  int64_t timed_steps = 0;
  std::vector<double> peak_rss_mb;
  int world_size = 1;
  int rank = 0;
  std::string precision = "no";
  int accumulation = 1;
  std::string strategy = "single";
  nlohmann::ordered_json memory;           // rank 0's memory report
  nlohmann::ordered_json memory_per_rank;  // every rank's
  nlohmann::ordered_json comm;             // rank 0's collective bytes in the training loop
};

nlohmann::ordered_json to_json(const hasten::MemoryReport& m) {
  return {{"params", m.params},           {"param_shards", m.param_shards}, {"grads", m.grads},
          {"optimizer", m.optimizer},     {"peak_full_params", m.peak_params}, {"peak_grads", m.peak_grads},
          {"peak_optimizer", m.peak_optimizer}, {"at_rest", m.at_rest()}};
}

// --trace-out: rank 0's gradients after every backward and its parameters after every
// optimizer call, each record every parameter's values in registration order, as raw float32
// (PREFIX.grads.f32, PREFIX.params.f32; no gradients under zero and fsdp, whose gradients live
// in the shards). torch_peer.py --trace-out writes the same records, so
// a parity failure can be found at the first micro-batch and tensor where the two part.
class Trace {
 public:
  Trace(const std::string& prefix, bool enabled, bool with_grads) {
    if (prefix.empty() || !enabled) return;
    if (with_grads) grads_.open(prefix + ".grads.f32", std::ios::binary | std::ios::trunc);
    params_.open(prefix + ".params.f32", std::ios::binary | std::ios::trunc);
    if ((with_grads && !grads_) || !params_)
      throw hasten::Error("cannot write --trace-out files '" + prefix + ".*.f32'");
  }
  void grads(const std::vector<torch::Tensor>& params) {
    if (!grads_.is_open()) return;
    for (const auto& p : params) {
      // A parameter without a gradient yet is a record of zeros, as PyTorch's zero_grad leaves it.
      write(grads_, p.grad().defined() ? p.grad() : torch::zeros_like(p));
    }
  }
  void params(const std::vector<torch::Tensor>& params) {
    if (!params_.is_open()) return;
    for (const auto& p : params) write(params_, p);
  }

 private:
  static void write(std::ofstream& out, const torch::Tensor& t) {
    const auto c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
    out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * sizeof(float)));
    if (!out) throw hasten::Error("--trace-out: write failed");
  }
  std::ofstream grads_, params_;
};

// The progress bar of a run: on stderr, so that stdout keeps the summary; drawn by the local
// main process only, and not at all with --quiet.
hasten::ProgressOptions progress_options(const Args& a, bool local_main) {
  hasten::ProgressOptions po;
  po.description = a.mode.empty() ? a.workload : a.workload + " " + a.mode;
  po.enabled = local_main && !a.quiet;
  return po;
}

// The plain LibTorch loop: no hasten code in the step.
Result train_libtorch(const Args& a, int64_t batch, int64_t total) {
  torch::manual_seed(0);
  auto model = W::build_model(a.workload);
  auto [inputs, targets] = W::build_data(a.workload);
  torch::optim::AdamW opt(model->parameters(), W::optimizer_options());
  const bool bf16 = a.options.mixed_precision.value_or("no") == "bf16";
  const int64_t n = inputs.size(0);
  std::vector<torch::Tensor> losses;
  losses.reserve(static_cast<size_t>(total));
  Result r;
  Trace trace(a.trace_out, true, true);
  hasten::ProgressBar bar(total, progress_options(a, /*main=*/true));
  Clock::time_point t0 = Clock::now();
  for (int64_t i = 0; i < total; ++i) {
    if (i == a.warmup) t0 = Clock::now();
    const int64_t start = (i * batch) % n;
    auto x = W::model_input(a.workload, inputs.narrow(0, start, batch));
    auto y = targets.narrow(0, start, batch);
    torch::Tensor out;
    if (bf16) {
      hasten::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
      hasten::compat::set_autocast_dtype(c10::DeviceType::CPU, at::kBFloat16);
      at::autocast::increment_nesting();
      out = model->forward(x);
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      hasten::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
      out = out.to(torch::kFloat);
    } else {
      out = model->forward(x);
    }
    auto loss = W::loss(a.workload, out, y);
    loss.backward();
    trace.grads(model->parameters());
    opt.step();
    trace.params(model->parameters());
    opt.zero_grad();
    losses.push_back(loss.detach());
    if (bar.enabled()) bar.set("loss", loss.item<double>());
    bar.update(1, batch);
  }
  bar.close();
  r.timed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  r.timed_steps = total - a.warmup;
  auto all = torch::stack(losses).to(torch::kCPU, torch::kDouble);
  r.losses.assign(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
  r.peak_rss_mb = {W::peak_rss_mb()};
  r.precision = bf16 ? "bf16" : "no";
  return r;
}

Result train_hasten(const Args& a, int64_t batch, int64_t total) {
  hasten::Options options = a.options;
  if (a.resume) options.resume = "auto";
  hasten::Accelerator acc(options);
  torch::manual_seed(0);
  auto model = W::build_model(a.workload, a.units);
  auto [inputs, targets] = W::build_data(a.workload);
  torch::optim::AdamW optimizer(model->parameters(), W::optimizer_options());
  hasten::DataLoader data(hasten::TensorDataset(inputs, targets), {.batch_size = batch});

  auto [net, opt, loader] = acc.prepare(model, optimizer, data);
  // Under zero and fsdp the gradients live in the shards: the trace holds parameters only,
  // gathered whole after every optimizer call (a collective: every rank takes part).
  const bool sharded = acc.strategy() != "ddp" && acc.strategy() != "single";
  Trace trace(a.trace_out, acc.process_index() == 0, /*grads=*/!sharded);
  auto full_parameters = [&] {
    if (!sharded) return net->parameters();
    std::vector<torch::Tensor> out;
    for (auto& [name, t] : acc.get_state_dict(net)) out.push_back(t);
    return out;
  };

  const bool tracking = a.log_every > 0 && !acc.config().trackers.empty();
  if (tracking)
    acc.init_trackers(a.project, {{"workload", a.workload},
                                  {"batch_size", batch},
                                  {"steps", total},
                                  {"mixed_precision", acc.mixed_precision()},
                                  {"strategy", acc.strategy()},
                                  {"gradient_accumulation_steps", int64_t{acc.gradient_accumulation_steps()}},
                                  {"num_processes", int64_t{acc.num_processes()}}});
  StepCounter counter;
  acc.register_for_checkpointing(counter);
  int64_t& step = counter.value;
  Result r;
  // Config resume (--resume is resume: auto) applies here, after everything is prepared and
  // registered: the newest complete checkpoint, if there is one.
  if (const std::string from = acc.resumed_from(); !from.empty()) {
    r.resumed_at = step;
    if (!a.json) acc.print("resumed at step ", step, " from ", from);
  }
  std::vector<torch::Tensor> losses;
  losses.reserve(static_cast<size_t>(total));
  Clock::time_point t0 = Clock::now(), last = t0;
  hasten::ProgressBar bar(total - step, progress_options(a, acc.is_local_main_process()));
  const int64_t samples_per_step = batch * acc.num_processes();
  while (step < total) {
    for (auto& b : loader) {
      if (step == a.warmup) {
        finish_device_work(acc.device());  // the warm-up's kernels are not timed
        t0 = Clock::now();
      }
      auto scope = acc.accumulate(net);
      auto loss = W::loss(a.workload, net(W::model_input(a.workload, b.input)), b.target);
      acc.backward(loss);
      trace.grads(net->parameters());
      if (a.clip > 0 && acc.sync_gradients()) acc.clip_grad_norm_(net, a.clip);
      opt.step();
      if (!a.trace_out.empty()) trace.params(full_parameters());
      opt.zero_grad();
      losses.push_back(loss.detach());
      ++step;
      if (bar.enabled()) bar.set("loss", loss.item<double>());
      bar.update(1, samples_per_step);
      if (tracking && step % a.log_every == 0) {
        const double l = loss.item<double>();
        const double dt = std::chrono::duration<double>(Clock::now() - last).count();
        last = Clock::now();
        const double sps = static_cast<double>(a.log_every * samples_per_step) / dt;
        acc.log({{"loss", l}, {"samples_per_s", sps}}, step);
      }
      if (a.checkpoint_every > 0 && step % a.checkpoint_every == 0) acc.save_state();
      kill_for_tests(acc, step);
      if (step >= total) break;
    }
  }
  bar.close();
  {
    // The training's collectives (prepare's broadcast included), before the summary's own.
    const hasten::CommStats cs = acc.comm_stats();
    auto side = [](const hasten::CommBytes& b) {
      return nlohmann::ordered_json{{"allreduce", b.allreduce}, {"allgather", b.allgather},
                                    {"reduce_scatter", b.reduce_scatter}, {"broadcast", b.broadcast}};
    };
    r.comm = {{"within_machine", side(cs.within_machine)}, {"across_machines", side(cs.across_machines)}};
  }
  finish_device_work(acc.device());  // a GPU may still run the last steps the host queued
  r.timed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  r.timed_steps = std::max<int64_t>(0, total - std::max(a.warmup, r.resumed_at));
  r.world_size = acc.num_processes();
  r.rank = acc.process_index();
  r.precision = acc.mixed_precision();
  r.accumulation = acc.gradient_accumulation_steps();
  // Every rank's losses, averaged (for ddp: the loss of the global batch).
  if (!losses.empty()) {  // a run resumed at its last step has none (the same on every rank)
    // On the CPU: the losses stayed on the run's device, and data_ptr below reads host memory.
    auto all = acc.reduce(torch::stack(losses).to(torch::kDouble), "mean").to(torch::kCPU);
    r.losses.assign(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
  }
  auto rss = acc.gather(torch::tensor({W::peak_rss_mb()}, torch::kDouble)).to(torch::kCPU);
  r.peak_rss_mb.assign(rss.data_ptr<double>(), rss.data_ptr<double>() + rss.numel());
  r.strategy = acc.strategy();
  // What each rank holds at rest (after the last step), with the peaks of the run.
  const hasten::MemoryReport mine = acc.memory_report();
  const auto fields = torch::tensor({static_cast<int64_t>(mine.params), static_cast<int64_t>(mine.param_shards),
                                     static_cast<int64_t>(mine.grads), static_cast<int64_t>(mine.optimizer),
                                     static_cast<int64_t>(mine.peak_params), static_cast<int64_t>(mine.peak_grads),
                                     static_cast<int64_t>(mine.peak_optimizer)});
  auto all_fields = acc.gather(fields).to(torch::kCPU).reshape({acc.num_processes(), 7});
  r.memory = to_json(mine);
  r.memory_per_rank = nlohmann::ordered_json::array();
  for (int64_t k = 0; k < all_fields.size(0); ++k) {
    hasten::MemoryReport m;
    m.params = all_fields[k][0].item<int64_t>(), m.param_shards = all_fields[k][1].item<int64_t>();
    m.grads = all_fields[k][2].item<int64_t>(), m.optimizer = all_fields[k][3].item<int64_t>();
    m.peak_params = all_fields[k][4].item<int64_t>(), m.peak_grads = all_fields[k][5].item<int64_t>();
    m.peak_optimizer = all_fields[k][6].item<int64_t>();
    r.memory_per_rank.push_back(to_json(m));
  }
  {
    auto state = acc.get_state_dict(net);  // every rank takes part; rank 0 gets the tensors
    if (acc.is_main_process()) {
      r.param_checksum = hasten::param_checksum(state);
      if (!a.params_out.empty()) hasten::save_safetensors(a.params_out, state);
    }
  }
  if (tracking) {
    if (!r.losses.empty()) acc.log({{"final_loss", r.losses.back()}}, step);
    acc.end_training();
  }
  return r;
}

}  // namespace

int run(const Args& a) {
  const W::Spec& spec = W::spec(a.workload);
  const int64_t batch = a.batch > 0 ? a.batch : spec.batch;
  const int64_t timed = a.steps >= 0 ? a.steps : spec.timed_steps;
  const int64_t total = a.warmup + timed;
  if (total <= 0) throw std::invalid_argument("--steps plus --warmup must be positive");
  torch::set_num_threads(a.threads);
  hasten::set_blas_threads(a.threads);  // OpenBLAS's pool too: its size decides the rounding

  Result r = a.impl == "libtorch" ? train_libtorch(a, batch, total) : train_hasten(a, batch, total);
  if (r.rank != 0) return 0;

  const int accum = r.accumulation;
  std::string mode = a.mode;
  if (mode.empty()) {
    if (r.world_size > 1)
      mode = (r.strategy == "single" || r.strategy == "ddp" ? "ddp" + std::to_string(r.world_size)
                                                             : r.strategy + "-w" + std::to_string(r.world_size)) +
             (accum > 1 ? "-accum" + std::to_string(accum) : "") + (r.precision == "no" ? "" : "-" + r.precision);
    else
      mode = r.precision == "no" ? "single" : r.precision;
  }
  const double steps_per_s = r.timed_steps > 0 && r.timed_s > 0 ? r.timed_steps / r.timed_s : 0.0;
  nlohmann::ordered_json rec;
  rec["impl"] = a.impl;
  rec["workload"] = a.workload;
  rec["mode"] = mode;
  rec["steps_per_s"] = steps_per_s;
  rec["samples_per_s"] = steps_per_s * static_cast<double>(batch * r.world_size);
  rec["peak_rss_mb"] = r.peak_rss_mb;
  rec["final_loss"] = r.losses.empty() ? std::nan("") : r.losses.back();
  rec["losses_first5"] = std::vector<double>(r.losses.begin(), r.losses.begin() + std::min<size_t>(5, r.losses.size()));
  rec["samples_per_s_per_rank"] = steps_per_s * static_cast<double>(batch);
  rec["B"] = batch;
  rec["world_size"] = r.world_size;
  rec["S"] = r.timed_steps;
  rec["warmup"] = a.warmup;
  rec["timed_s"] = r.timed_s;
  rec["threads"] = a.threads;
  rec["torch"] = TORCH_VERSION;
  const auto blas = hasten::blas_info();
  rec["blas"] = blas.library == "openblas" ? "openblas:" + blas.core : blas.library;
  rec["blas_threads"] = blas.threads;
  if (a.impl == "hasten") {
    rec["strategy"] = r.strategy;
    rec["param_checksum"] = r.param_checksum;
    rec["resumed_at"] = r.resumed_at;
    rec["memory"] = r.memory;
    rec["memory_per_rank"] = r.memory_per_rank;
    rec["comm_bytes"] = r.comm;
  }
  if (a.json) {
    std::cout << rec.dump() << std::endl;
  } else {
    std::cout << "done: " << a.workload << " " << mode << ", " << total << " steps, final loss "
              << (r.losses.empty() ? std::nan("") : r.losses.back()) << ", " << steps_per_s << " steps/s ("
              << rec["samples_per_s"].get<double>() << " samples/s)" << std::endl;
  }
  if (!a.losses_out.empty()) {
    std::ofstream out(a.losses_out);
    out << nlohmann::ordered_json{{"impl", a.impl}, {"workload", a.workload}, {"mode", mode},
                                  {"B", batch}, {"losses", r.losses}}
               .dump()
        << "\n";
    if (!out) throw hasten::Error("cannot write --losses-out file '" + a.losses_out + "'");
  }
  return 0;
}


}  // namespace hasten::examples
