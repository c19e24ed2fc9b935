// save_state: writes what a run needs to continue exactly where it stopped (models,
// optimizers, schedulers, loader positions, accumulation, RNG, registered objects), each rank
// its own files; checkpoint_files.cpp makes the write atomic and verifiable, and
// checkpoint_load.cpp reads it back.
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/safetensors.hpp>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/cuda.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <mutex>

#include <hasten/plugin_torch.hpp>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/checkpoint_layout.hpp"
#include "checkpoint/checkpoint_machines.hpp"
#include "checkpoint/optimizer_state.hpp"
#include "engine/engine_state.hpp"
#include "parallel/split_parameters.hpp"
#include "util/test_hooks.hpp"
#include "util/trace_ranges.hpp"

namespace hasten::detail {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace checkpoint_layout;

namespace {

// The default generators' states: the CPU's and, on a GPU run, this rank's own device's under
// the rank-relative key "cuda" (as Accelerate's per-rank random_states_N): a resume with other
// gpu_ids or CUDA_VISIBLE_DEVICES gives the rank's device the state it saved, not another
// GPU's by visible index.
NamedTensors rng_state(const torch::Device& device) {
  NamedTensors out;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.emplace_back("cpu", gen.get_state());
  }
  if (device.is_cuda()) {
    auto gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.emplace_back("cuda", gen.get_state());
  }
  return out;
}

}  // namespace

void Engine::register_for_checkpointing(CheckpointObject object) {
  impl_->checkpoints.objects.push_back(std::move(object));
}

int64_t Engine::save_iteration() const { return impl_->checkpoints.save_iteration; }

size_t Engine::add_state_pre_hook(bool save, StateHook hook) {
  CheckpointRegistry& c = impl_->checkpoints;
  const size_t id = c.next_hook_id++;
  (save ? c.save_pre_hooks : c.load_pre_hooks).emplace(id, std::move(hook));
  return id;
}

void Engine::remove_state_pre_hook(size_t id) noexcept {
  impl_->checkpoints.save_pre_hooks.erase(id);
  impl_->checkpoints.load_pre_hooks.erase(id);
}

// Runs the pre-hooks of save_state or load_state on this rank and returns which prepared models
// they left to the call. Every rank must leave the same ones (the weights move collectively):
// a mask reduced both ways finds a difference, and every rank refuses it.
std::vector<bool> Engine::Impl::run_state_pre_hooks(bool save, const std::string& dir) {
  const char* what = save ? "save_state" : "load_state";
  StateHookArgs args;
  args.dir = dir;
  for (size_t i = 0; i < models.size(); ++i) args.models.push_back(i);
  std::vector<bool> kept(models.size(), false);
  std::string failure;  // a hook's error: every rank learns of it before anyone leaves
  // A copy: a hook may remove itself (or another) while they run.
  std::vector<StateHook> hooks;
  for (auto& [id, hook] : save ? checkpoints.save_pre_hooks : checkpoints.load_pre_hooks) hooks.push_back(hook);
  try {
    for (auto& hook : hooks) hook(args);
    for (size_t m : args.models) {
      if (m >= models.size())
        throw UsageError("a pre-hook put model " + std::to_string(m) + " in the list, and there are " +
                         std::to_string(models.size()) + " prepared models");
      kept[m] = true;
    }
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "an exception that is not a std::exception";
  }
  // [kept models..., this rank failed], reduced to its maximum and (negated) its minimum.
  const auto n = static_cast<int64_t>(models.size());
  torch::Tensor high = torch::zeros({n + 1}, torch::kDouble);
  for (int64_t m = 0; m < n; ++m) high[m] = kept[static_cast<size_t>(m)] ? 1.0 : 0.0;
  high[n] = failure.empty() ? 0.0 : 1.0;
  torch::Tensor low = -high.clone();
  if (process.world_size > 1) {
    allreduce_(high, HASTEN_REDUCE_MAX);
    allreduce_(low, HASTEN_REDUCE_MAX);
  }
  if (!failure.empty()) throw Error(std::string(what) + ": a pre-hook failed: " + failure);
  if (high[n].item<double>() > 0)
    throw Error(std::string(what) + ": a pre-hook failed on another rank (its message is in that rank's output)");
  if (!torch::equal(high, -low))
    throw UsageError(std::string(what) + ": the pre-hooks left different models on different ranks (every rank's "
                     "hooks must take out the same ones: the weights are gathered collectively)");
  return kept;
}

std::string Engine::save_state(const std::string& requested) {
  TraceRange range("hasten::save_state");
  Impl& s = *impl_;
  const int rank = s.process.rank, world = s.process.world_size;
  const bool main = rank == 0;
  const bool automatic = s.config.automatic_checkpoint_naming || requested.empty();

  // Where: rank 0 decides and prepares the temporary directory; every rank learns the outcome.
  // save_on_each_node across machines: each machine's lowest rank prepares its own (under its
  // own project_dir where the name is automatic), and writes what rank 0 writes.
  const bool each_machine = saving_on_each_machine(*this, s.process, s.config.save_on_each_node, "save_state");
  MachineCopies copies;
  fs::path target;
  if (each_machine) {
    // Rank 0's number: every machine's copy carries the same name.
    s.checkpoints.save_iteration = std::stoll(broadcast(std::to_string(s.checkpoints.save_iteration), 0));
    target = automatic ? checkpoints_dir(s.config.project_dir) / ("checkpoint_" + std::to_string(s.checkpoints.save_iteration))
                       : fs::path(requested);
    copies = prepare_machine_copies(*this, s.process, target, automatic);
  } else {
    std::string decided;
    if (main) {
      try {
        const fs::path local = automatic ? checkpoints_dir(s.config.project_dir) /
                                               ("checkpoint_" + std::to_string(s.checkpoints.save_iteration))
                                         : fs::path(requested);
        std::error_code ec;
        if (automatic && fs::exists(fs::symlink_status(local, ec)))
          throw Error("save_state: '" + local.string() +
                      "' already exists (a run that continues calls load_state() first; new checkpoints are then "
                      "numbered after the newest one)");
        prepare_save(local);  // refuses what is not a hasten checkpoint; makes the temporary directory
        decided = "ok:" + local.string();
      } catch (const std::exception& e) {
        decided = std::string("error:") + e.what();
      }
    }
    decided = broadcast(decided, 0);
    if (decided.rfind("error:", 0) == 0) throw Error(decided.substr(6));
    target = decided.substr(3);
    copies.writers = {0};
    copies.writer = main;
    if (main)
      for (int r = 0; r < world; ++r) copies.ranks.push_back(r);
  }
  const bool writer = copies.writer;  // writes what rank 0 writes, into this machine's copy
  const fs::path tmp = saving_dir(target);

  // What: every rank writes its files. Gathering full models is collective, so every rank runs
  // every gather even after one of its writes failed.
  std::vector<FileRecord> files;
  std::string failure;
  auto attempt = [&](const std::function<void()>& fn) {
    if (!failure.empty()) return;
    try {
      fn();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  };
  // Pre-hooks (register_save_state_pre_hook): they may write into the staging directory and
  // take models whose weights they save themselves out of the list.
  std::vector<bool> write_model;
  try {
    write_model = s.run_state_pre_hooks(true, tmp.string());
  } catch (const std::exception&) {
    std::error_code ec;
    if (writer) fs::remove_all(tmp, ec);  // nothing was saved: no staging directory is left behind
    throw;
  }
  for (size_t i = 0; i < s.models.size(); ++i) {
    if (!write_model[i]) continue;
    NamedTensors full = state_dict(i, 0);  // rank 0 holds them
    if (copies.writers != std::vector<int>{0}) full = share_with_writers(*this, rank, full, copies.writers);
    if (writer)
      attempt([&] {
        files.push_back(write_file(
            tmp, model_file(i), [&](const ByteSink& sink) { write_safetensors(full, {{"format", "pt"}}, sink); },
            kChunkSize));  // chunk checksums: a sharding strategy's ranks read only their slices
      });
  }
  test_point("save-model-written", rank);  // test builds: a kill in the middle of a save
  const bool per_rank = s.strategy->has_load_state_dict();  // it shards: so does optimizer state
  // In the middle of an accumulation window the gradients accumulated so far are part of the
  // state: each rank's own, not yet synchronised ones, as its parameters' .grad show them
  // (under zero and fsdp, views of the unit's full local gradient buffer, kept until the
  // window's synchronising micro-batch reduces it). Loading sets them back as .grad, which
  // the strategy takes into its buffers at the next backward.
  const bool mid_window = s.accumulation.step % std::max(1, s.config.gradient_accumulation_steps) != 0;
  if (mid_window)
    for (size_t i = 0; i < s.models.size(); ++i)
      attempt([&] {
        NamedTensors grads;
        for (auto& named : s.models[i].module->named_parameters())
          // A sparse .grad is the sharded strategies' placeholder at rest: no local gradient.
          if (named.value().grad().defined() && !named.value().grad().is_sparse())
            grads.emplace_back(named.key(), named.value().grad());
        files.push_back(write_file(tmp, gradients_file(i, rank), [&](const ByteSink& sink) { write_safetensors(grads, {}, sink); }));
      });
  // Optimizers: the portable layout (state tensors by parameter name, in pieces), which loads
  // on any number of ranks under any strategy; LibTorch's own archive for optimizer types
  // hasten cannot read (it loads only where it was saved: same ranks, same strategy).
  json optimizer_layouts = json::array();
  const bool tensor_parallel = any_split_parameters(s.models);  // parts of tensors split over a group
  for (size_t i = 0; i < s.optimizers.size(); ++i) {
    torch::optim::Optimizer& optimizer = *s.optimizers[i].optimizer;
    NamedTensors pieces;
    bool portable = true;
    // Unsharded optimizer state is rank 0's file; each machine's copy (save_on_each_node)
    // carries it too, written by its writer, which holds the same state.
    const int piece_rank = writer && !s.strategy->has_optimizer_state() ? 0 : rank;
    try {
      for (size_t m = 0; m < s.models.size(); ++m)
        for (auto& piece : optimizer_pieces(*this, *s.strategy, piece_rank, optimizer, *s.models[m].module, m))
          pieces.push_back(std::move(piece));
    } catch (const sdk::Error& e) {  // from sdk::param_state, here in the host
      if (e.status() != HASTEN_ERR_UNSUPPORTED) throw;
      portable = false;
    } catch (const PluginError& e) {  // from a strategy's optimizer_state
      if (std::string(e.what()).find("(unsupported)") == std::string::npos) throw;
      portable = false;
    }
    // Every rank must agree on the layout: the optimizer type is the same everywhere.
    optimizer_layouts.push_back(portable ? "portable" : per_rank ? "per_rank" : "full");
    if (!portable && tensor_parallel)
      attempt([&] {
        throw Error("optimizer " + std::to_string(i) + " (" + optimizer_type(optimizer) +
                    ") keeps a state hasten cannot read, so the state of the model's tensor-parallel parts cannot be "
                    "written whole (SGD, Adam, AdamW, RMSprop and Adagrad can)");
      });
    if (portable && !pieces.empty())
      attempt([&] {
        files.push_back(write_file(tmp, optimizer_pieces_file(i, piece_rank), [&](const ByteSink& sink) {
          write_safetensors(pieces, {}, sink);
        }));
      });
    if (!portable && (per_rank || writer))
      attempt([&] { files.push_back(write_file(tmp, optimizer_file(i, per_rank ? rank : -1), optimizer_bytes(optimizer))); });
  }
  attempt([&] {
    const NamedTensors rng = rng_state(s.device);
    files.push_back(write_file(tmp, rng_file(rank), [&](const ByteSink& sink) { write_safetensors(rng, {}, sink); }));
  });
  if (writer) {
    for (size_t i = 0; i < s.checkpoints.objects.size(); ++i) {
      auto& o = s.checkpoints.objects[i];
      attempt([&] {
        if (o.save_tensors) {
          const NamedTensors t = o.save_tensors();
          files.push_back(write_file(tmp, custom_file(i, true), [&](const ByteSink& sink) { write_safetensors(t, {}, sink); }));
        } else {
          files.push_back(write_file(tmp, custom_file(i, false), o.save_bytes()));
        }
      });
    }
    json loaders = json::array();
    for (size_t id = 0; id < s.data.loaders.size(); ++id) {
      const LoaderEntry& e = s.data.loaders[id];
      const LoaderState position = loader_state(id);
      loaders.push_back({{"epoch", position.epoch},
                         {"next_batch", position.next_batch},
                         {"num_batches", e.num_batches},
                         {"dataset_size", e.spec.dataset_size},
                         {"batch_size", e.spec.options.batch_size},
                         {"world_size", e.spec.world_size}});  // the ranks it was sharded over (dp)
    }
    json schedulers = json::array();
    json adjustments = json::array();  // adjust_scheduler's micro-batch counts (bounded schedules)
    for (auto& sc : s.schedulers) {
      schedulers.push_back(sc.steps);
      adjustments.push_back(sc.adjustments);
    }
    json custom = json::array();
    for (auto& o : s.checkpoints.objects) custom.push_back(o.save_tensors ? "tensors" : "bytes");
    json types = json::array();  // loading into another optimizer type must be refused
    for (auto& e : s.optimizers) types.push_back(optimizer_type(*e.optimizer));
    json lrs = json::array();  // each param group's learning rate (the portable layout has no groups)
    for (auto& e : s.optimizers) {
      json groups = json::array();
      for (auto& g : e.optimizer->param_groups()) groups.push_back(g.options().get_lr());
      lrs.push_back(groups);
    }
    json state = {{"checkpoint", automatic ? json(s.checkpoints.save_iteration) : json(nullptr)},
                  {"strategy", s.strategy->name()},
                  {"world_size", world},
                  {"tp_size", s.groups->layout().size("tp")},  // mid-window gradients are tp parts
                  {"models", s.models.size()},
                  {"optimizers", {{"count", s.optimizers.size()}, {"layouts", optimizer_layouts}, {"lr", lrs}, {"types", types}}},
                  {"schedulers", schedulers},
                  {"scheduler_adjustments", adjustments},
                  {"loaders", loaders},
                  {"accumulation", {{"step", s.accumulation.step}, {"window", s.accumulation.window}}},
                  {"custom", custom}};
    // The precision's state (fp16: the loss scaler's scale and growth tracker), equal on every
    // rank (each step's overflow verdict is agreed by all): rank 0's.
    // A failure here is recorded like a write's (every rank then learns of it below).
    if (s.precision)
      attempt([&] {
        if (auto text = s.precision->state_dict()) {
          json parsed = json::parse(*text, nullptr, false);
          if (!parsed.is_object())
            throw Error("precision plugin '" + s.precision->name() + "' returned a state that is not a JSON object: " +
                        *text);
          state["precision"] = {{"plugin", s.precision->name()}, {"state", parsed}};
        }
      });
    attempt([&] { files.push_back(write_file(tmp, kState, state.dump(1))); });
  }
  attempt([&] { write_rank_files(tmp, rank, files); });

  // Did every rank write everything? Then each copy's writer makes it complete in one rename.
  torch::Tensor failed = torch::full({1}, failure.empty() ? 0.0 : static_cast<double>(rank + 1), torch::kDouble);
  s.allreduce_(failed, HASTEN_REDUCE_MAX);
  const int failed_rank = static_cast<int>(failed.item<double>()) - 1;
  if (failed_rank >= 0) {
    if (writer) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    if (!failure.empty()) throw Error("save_state: " + failure + " (the previous checkpoint is untouched)");
    throw Error("save_state: rank " + std::to_string(failed_rank) +
                " could not write its files (its message says why); the previous checkpoint is untouched");
  }
  std::string finished = "ok";
  if (writer) {
    try {
      json meta = {{"checkpoint", automatic ? json(s.checkpoints.save_iteration) : json(nullptr)}, {"strategy", s.strategy->name()}};
      if (!copies.save.empty()) meta["save"] = copies.save;  // ties the machines' copies together
      finalize_checkpoint(tmp, target, world, meta, copies.ranks);  // replaces an explicit directory saved again
    } catch (const std::exception& e) {
      finished = std::string("error:") + e.what();
    }
  }
  // Each writer's outcome reaches every rank (the first failing writer's words).
  torch::Tensor unfinished = torch::full({1}, finished == "ok" ? 0.0 : static_cast<double>(world - rank), torch::kDouble);
  s.allreduce_(unfinished, HASTEN_REDUCE_MAX);
  if (const int who = world - static_cast<int>(unfinished.item<double>()); who < world) {
    finished = broadcast(finished, who);
    throw Error(finished.substr(6) + (copies.writers.size() > 1 ? " (on the machine of rank " + std::to_string(who) + ")" : ""));
  }
  // Old checkpoints go only once every copy of the new one is complete.
  if (writer && automatic && s.config.total_limit > 0)
    for (auto& why : prune_checkpoints(checkpoints_dir(s.config.project_dir), s.config.total_limit))
      get_logger()->warn("save_state: could not remove an old checkpoint: {}", why);
  if (automatic) ++s.checkpoints.save_iteration;
  get_logger()->debug("save_state: {}", target.string());
  return target.string();
}

}  // namespace hasten::detail
