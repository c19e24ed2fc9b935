// Checkpoints: save_state writes what a run needs to continue exactly where it stopped
// (models, optimizers, schedulers, loader positions, accumulation, RNG, registered objects);
// checkpoint_files.cpp makes the write atomic and verifiable. load_state reads it back.
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/safetensors.hpp>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/cuda.h>

#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#define HASTEN_PLUGIN_TORCH_TIER 1  // sdk::param_state, set_param_state
#include <hasten/plugin.hpp>

#include "checkpoint_files.hpp"
#include "optimizer_state.hpp"
#include "engine_state.hpp"

namespace hasten::detail {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string indexed(const std::string& stem, size_t i, const std::string& ext) {
  return stem + (i == 0 ? "" : "_" + std::to_string(i)) + ext;
}
std::string model_file(size_t i) { return indexed("model", i, ".safetensors"); }
// Unsharded optimizers are the same on every rank: one file. Sharded ones: one per rank.
std::string optimizer_file(size_t i, int rank) {
  return indexed("optimizer", i, rank < 0 ? ".bin" : ".rank" + std::to_string(rank) + ".bin");
}
std::string gradients_file(size_t i, int rank) {
  return indexed("gradients", i, ".rank" + std::to_string(rank) + ".safetensors");
}
std::string optimizer_pieces_file(size_t i, int rank) {
  return indexed("optimizer", i, ".rank" + std::to_string(rank) + ".safetensors");
}

std::string rng_file(int rank) { return "random_states_" + std::to_string(rank) + ".safetensors"; }
std::string custom_file(size_t i, bool tensors) {
  return "custom_checkpoint_" + std::to_string(i) + (tensors ? ".safetensors" : ".bin");
}
constexpr const char* kState = "hasten_state.json";

NamedTensors rng_state() {
  NamedTensors out;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.emplace_back("cpu", gen.get_state());
  }
  if (torch::cuda::is_available())
    for (size_t d = 0; d < torch::cuda::device_count(); ++d) {
      auto gen = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(d)));
      std::lock_guard<std::mutex> lock(gen.mutex());
      out.emplace_back("cuda:" + std::to_string(d), gen.get_state());
    }
  return out;
}

void set_rng_state(const NamedTensors& states) {
  for (auto& [name, state] : states) {
    if (name == "cpu") {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    } else if (name.rfind("cuda:", 0) == 0 && torch::cuda::is_available()) {
      const auto d = static_cast<size_t>(std::stoul(name.substr(5)));
      if (d >= torch::cuda::device_count()) continue;
      auto gen = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(d)));
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
  }
}

// Copies full tensors into a module's own parameters and buffers, by name, strictly.
void copy_into(torch::nn::Module& module, const NamedTensors& tensors, const std::string& file) {
  std::map<std::string, const torch::Tensor*> by_name;
  for (auto& [name, t] : tensors) by_name[name] = &t;
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, torch::Tensor& target) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw Error("load_state: '" + file + "' has no tensor '" + name + "', which the model has");
    if (it->second->sizes() != target.sizes())
      throw Error("load_state: '" + file + "': '" + name + "' has shape " + c10::str(it->second->sizes()) +
                  ", the model's is " + c10::str(target.sizes()));
    target.copy_(*it->second);
    by_name.erase(it);
  };
  for (auto& named : module.named_parameters()) load(named.key(), named.value());
  for (auto& named : module.named_buffers()) load(named.key(), named.value());
  if (!by_name.empty())
    throw Error("load_state: '" + file + "' has '" + by_name.begin()->first + "', which the model does not");
}

fs::path checkpoints_dir(const Config& c) { return fs::path(c.project_dir) / "checkpoints"; }

}  // namespace

void Engine::register_for_checkpointing(CheckpointObject object) {
  impl_->checkpoint_objects.push_back(std::move(object));
}

int64_t Engine::save_iteration() const { return impl_->save_iteration; }

std::string Engine::save_state(const std::string& requested) {
  Impl& s = *impl_;
  const int rank = s.process.rank, world = s.process.world_size;
  const bool main = rank == 0;
  const bool automatic = s.config.automatic_checkpoint_naming || requested.empty();

  // Where: rank 0 decides and prepares the temporary directory; every rank learns the outcome.
  std::string decided;
  if (main) {
    try {
      const fs::path target = automatic ? checkpoints_dir(s.config) / ("checkpoint_" + std::to_string(s.save_iteration))
                                        : fs::path(requested);
      std::error_code ec;
      if (automatic && fs::exists(target, ec))
        throw Error("save_state: '" + target.string() +
                    "' already exists (a run that continues calls load_state() first; new checkpoints are then "
                    "numbered after the newest one)");
      if (!automatic && fs::exists(target, ec) && !fs::exists(target / "manifest.json", ec))
        throw Error("save_state: '" + target.string() +
                    "' exists and is not a hasten checkpoint (no manifest.json); it is left alone: choose another "
                    "directory (a checkpoint directory is replaced as a whole)");
      if (target.filename().empty() || target.filename() == "." || target.filename() == "..")
        throw Error("save_state: '" + target.string() + "' does not name a directory to create");
      const fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".saving");
      fs::create_directories(target.parent_path().empty() ? fs::path(".") : target.parent_path());
      fs::remove_all(tmp);  // a save that died before
      fs::create_directories(tmp);
      decided = "ok:" + target.string();
    } catch (const std::exception& e) {
      decided = std::string("error:") + e.what();
    }
  }
  decided = broadcast(decided, 0);
  if (decided.rfind("error:", 0) == 0) throw Error(decided.substr(6));
  const fs::path target = decided.substr(3);
  const fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".saving");

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
  for (size_t i = 0; i < s.models.size(); ++i) {
    const NamedTensors full = state_dict(i, 0);  // rank 0 holds them
    if (main)
      attempt([&] {
        files.push_back(write_file(tmp, model_file(i), [&](const ByteSink& sink) {
          write_safetensors(full, {{"format", "pt"}}, sink);
        }));
      });
  }
  // Tests only: HASTEN_TEST_CRASH_IN_SAVE=N kills rank HASTEN_TEST_CRASH_RANK (default 0) with
  // SIGKILL in the middle of its N-th save, after its model files are written.
  {
    static int saves = 0;
    ++saves;
    const char* n = std::getenv("HASTEN_TEST_CRASH_IN_SAVE");
    const char* r = std::getenv("HASTEN_TEST_CRASH_RANK");
    if (n != nullptr && std::atoi(n) == saves && rank == (r != nullptr ? std::atoi(r) : 0)) ::raise(SIGKILL);
  }
  const bool per_rank = s.strategy->has_load_state_dict();  // it shards: so does optimizer state
  // In the middle of an accumulation window the gradients accumulated so far are part of the
  // state: each rank's own (not yet synchronised) gradients are saved, where the strategy
  // keeps them in the parameters.
  const bool mid_window = s.accum_step % std::max(1, s.config.gradient_accumulation_steps) != 0;
  if (mid_window && per_rank && main)
    get_logger()->warn("save_state: called in the middle of an accumulation window under {}: the partial gradients "
                       "are not saved, so a run resumed here differs from one that went on; save after a "
                       "synchronising step (when sync_gradients() is true)",
                       s.strategy->name());
  if (mid_window && !per_rank)
    for (size_t i = 0; i < s.models.size(); ++i)
      attempt([&] {
        NamedTensors grads;
        for (auto& named : s.models[i].module->named_parameters())
          if (named.value().grad().defined()) grads.emplace_back(named.key(), named.value().grad());
        files.push_back(write_file(tmp, gradients_file(i, rank), [&](const ByteSink& sink) { write_safetensors(grads, {}, sink); }));
      });
  // Optimizers: the portable layout (state tensors by parameter name, in pieces), which loads
  // on any number of ranks under any strategy; LibTorch's own archive for optimizer types
  // hasten cannot read (it loads only where it was saved: same ranks, same strategy).
  json optimizer_layouts = json::array();
  for (size_t i = 0; i < s.optimizers.size(); ++i) {
    torch::optim::Optimizer& optimizer = *s.optimizers[i].optimizer;
    NamedTensors pieces;
    bool portable = true;
    try {
      for (size_t m = 0; m < s.models.size(); ++m)
        for (auto& piece : optimizer_pieces(*s.strategy, rank, optimizer, *s.models[m].module, m))
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
    if (portable && !pieces.empty())
      attempt([&] {
        files.push_back(write_file(tmp, optimizer_pieces_file(i, rank), [&](const ByteSink& sink) {
          write_safetensors(pieces, {}, sink);
        }));
      });
    if (!portable && (per_rank || main))
      attempt([&] { files.push_back(write_file(tmp, optimizer_file(i, per_rank ? rank : -1), optimizer_bytes(optimizer))); });
  }
  attempt([&] {
    const NamedTensors rng = rng_state();
    files.push_back(write_file(tmp, rng_file(rank), [&](const ByteSink& sink) { write_safetensors(rng, {}, sink); }));
  });
  if (main) {
    for (size_t i = 0; i < s.checkpoint_objects.size(); ++i) {
      auto& o = s.checkpoint_objects[i];
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
    for (size_t id = 0; id < s.loaders.size(); ++id) {
      const LoaderEntry& e = s.loaders[id];
      // A loop left with `break` before the save: this process's next `for` would begin a new
      // epoch, so the resumed one does too (only an iteration under way resumes mid-epoch).
      int64_t epoch = e.epoch;
      int64_t next = e.resume_batch;
      for (auto it = s.active.rbegin(); it != s.active.rend(); ++it)
        if (it->id == id) {
          // Mid-epoch: the epoch under way, from the batch after the one yielded last.
          epoch = e.epoch - 1, next = it->batch + 1;
          if (next >= it->num_batches) epoch = e.epoch, next = 0;
          break;
        }
      loaders.push_back({{"epoch", epoch},
                         {"next_batch", next},
                         {"num_batches", e.num_batches},
                         {"dataset_size", e.spec.dataset_size},
                         {"batch_size", e.spec.options.batch_size},
                         {"world_size", world}});
    }
    json schedulers = json::array();
    for (auto& sc : s.schedulers) schedulers.push_back(sc.steps);
    json custom = json::array();
    for (auto& o : s.checkpoint_objects) custom.push_back(o.save_tensors ? "tensors" : "bytes");
    json types = json::array();  // loading into another optimizer type must be refused
    for (auto& e : s.optimizers) types.push_back(optimizer_type(*e.optimizer));
    json lrs = json::array();  // each param group's learning rate (the portable layout has no groups)
    for (auto& e : s.optimizers) {
      json groups = json::array();
      for (auto& g : e.optimizer->param_groups()) groups.push_back(g.options().get_lr());
      lrs.push_back(groups);
    }
    json state = {{"checkpoint", automatic ? json(s.save_iteration) : json(nullptr)},
                  {"strategy", s.strategy->name()},
                  {"world_size", world},
                  {"models", s.models.size()},
                  {"optimizers", {{"count", s.optimizers.size()}, {"layouts", optimizer_layouts}, {"lr", lrs}, {"types", types}}},
                  {"schedulers", schedulers},
                  {"loaders", loaders},
                  {"accumulation", {{"step", s.accum_step}, {"window", s.window}}},
                  {"custom", custom}};
    attempt([&] { files.push_back(write_file(tmp, kState, state.dump(1))); });
  }
  attempt([&] { write_rank_files(tmp, rank, files); });

  // Did every rank write everything? Then rank 0 makes the checkpoint complete in one rename.
  torch::Tensor failed = torch::full({1}, failure.empty() ? 0.0 : static_cast<double>(rank + 1), torch::kDouble);
  s.allreduce_(failed, HASTEN_REDUCE_MAX);
  const int failed_rank = static_cast<int>(failed.item<double>()) - 1;
  if (failed_rank >= 0) {
    if (main) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    if (!failure.empty()) throw Error("save_state: " + failure + " (the previous checkpoint is untouched)");
    throw Error("save_state: rank " + std::to_string(failed_rank) +
                " could not write its files (its message says why); the previous checkpoint is untouched");
  }
  std::string finished;
  if (main) {
    try {
      std::error_code ec;
      const fs::path old = target.string() + ".replaced";
      if (!automatic && fs::exists(target, ec)) {  // an explicit directory saved again
        fs::remove_all(old, ec);
        fs::rename(target, old);
      }
      json meta = {{"checkpoint", automatic ? json(s.save_iteration) : json(nullptr)}, {"strategy", s.strategy->name()}};
      finalize_checkpoint(tmp, target, world, meta);
      fs::remove_all(old, ec);
      if (automatic && s.config.total_limit > 0)
        for (auto& why : prune_checkpoints(checkpoints_dir(s.config), s.config.total_limit))
          get_logger()->warn("save_state: could not remove an old checkpoint: {}", why);
      finished = "ok";
    } catch (const std::exception& e) {
      finished = std::string("error:") + e.what();
    }
  }
  finished = broadcast(finished, 0);
  if (finished != "ok") throw Error(finished.substr(6));
  if (automatic) ++s.save_iteration;
  get_logger()->debug("save_state: {}", target.string());
  return target.string();
}

// A function-try-block: a hand-edited hasten_state.json whose fields have the wrong types
// makes nlohmann throw from anywhere below; it becomes one line naming the file.
std::string Engine::load_state(const std::string& requested) try {
  Impl& s = *impl_;
  if (!s.active.empty())
    throw UsageError("load_state: called while a prepared data loader is being iterated; call it after prepare and "
                     "before the loop (or set the config key resume: auto)");
  const int rank = s.process.rank, world = s.process.world_size;
  // Which: rank 0 verifies (sizes and checksums) and, without a path, falls back from a
  // damaged newest checkpoint to the newest complete one, saying so.
  std::string decided;
  if (rank == 0) {
    if (!requested.empty()) {
      const std::string why = verify_checkpoint(requested, true);
      decided = why.empty() ? "ok:" + requested : "error:load_state: " + why;
    } else {
      const fs::path dir = checkpoints_dir(s.config);
      auto all = numbered_checkpoints(dir);
      std::vector<std::string> skipped;
      for (auto it = all.rbegin(); it != all.rend() && decided.empty(); ++it) {
        const std::string why = verify_checkpoint(it->second, true);
        if (why.empty())
          decided = "ok:" + it->second.string();
        else
          skipped.push_back(why);
      }
      for (auto& why : skipped)
        get_logger()->warn("load_state: skipping a checkpoint that cannot be loaded: {}", why);
      if (decided.empty())
        decided = "error:load_state: no complete checkpoint under '" + dir.string() + "'" +
                  (skipped.empty() ? "" : " (" + std::to_string(skipped.size()) + " damaged or incomplete, see above)");
    }
  }
  decided = broadcast(decided, 0);
  if (decided.rfind("error:", 0) == 0) throw Error(decided.substr(6));
  const fs::path dir = decided.substr(3);
  const json manifest = read_manifest(dir);
  const json state = json::parse(read_file(dir / kState), nullptr, false);
  if (!state.is_object()) throw Error("load_state: '" + (dir / kState).string() + "' is malformed");
  auto expect = [&](const char* what, size_t saved, size_t now) {
    if (saved != now)
      throw Error("load_state: the checkpoint holds " + std::to_string(saved) + " " + what + ", this program prepared " +
                  std::to_string(now) + " ('" + dir.string() + "')");
  };
  const int saved_world = state.value("world_size", 1);
  expect("models", state.value("models", size_t{0}), s.models.size());
  expect("optimizers", state["optimizers"].value("count", size_t{0}), s.optimizers.size());
  expect("schedulers", state["schedulers"].size(), s.schedulers.size());
  expect("data loaders", state["loaders"].size(), s.loaders.size());
  expect("objects registered for checkpointing", state["custom"].size(), s.checkpoint_objects.size());

  for (size_t i = 0; i < s.models.size(); ++i) {
    const fs::path file = dir / model_file(i);
    const NamedTensors tensors = load_safetensors(file.string());
    if (s.strategy->has_load_state_dict())
      s.strategy->load_state_dict(*s.models[i].module, tensors);
    else
      copy_into(*s.models[i].module, tensors, file.string());
  }
  // Schedulers first: replaying their steps moves the learning rate, which the optimizer's
  // state then sets to exactly what was saved.
  for (size_t k = 0; k < s.schedulers.size(); ++k) {
    const int64_t saved = state["schedulers"][k].get<int64_t>();
    SchedulerEntry& sc = s.schedulers[k];
    if (sc.steps > saved)
      throw Error("load_state: scheduler " + std::to_string(k) + " has taken " + std::to_string(sc.steps) +
                  " steps, more than the checkpoint's " + std::to_string(saved) + "; call load_state before training");
    for (; sc.steps < saved; ++sc.steps) sc.step_once();
  }
  for (size_t i = 0; i < s.optimizers.size(); ++i) {
    const std::string saved_type = state["optimizers"]["types"].at(i).get<std::string>();
    if (saved_type != optimizer_type(*s.optimizers[i].optimizer))
      throw Error("load_state: optimizer " + std::to_string(i) + " was " + saved_type + " when saved, this program prepared " +
                  optimizer_type(*s.optimizers[i].optimizer) + " ('" + dir.string() + "')");
  }
  for (size_t i = 0; i < s.optimizers.size(); ++i) {
    torch::optim::Optimizer& optimizer = *s.optimizers[i].optimizer;
    const std::string layout = state["optimizers"]["layouts"].at(i).get<std::string>();
    if (layout == "portable") {
      // Every saved rank's pieces, assembled and re-sliced for this run's ranks and strategy.
      std::vector<fs::path> files;
      for (int r = 0; r < saved_world; ++r) files.push_back(dir / optimizer_pieces_file(i, r));
      auto full = assemble_optimizer(files);
      for (size_t m = 0; m < s.models.size(); ++m) {
        const NamedTensors& mine = full[m];
        if (s.strategy->has_load_optimizer_state())
          s.strategy->load_optimizer_state(optimizer, *s.models[m].module, mine);
        else
          set_optimizer_state(optimizer, *s.models[m].module, mine);
      }
      const json& lrs = state["optimizers"]["lr"].at(i);
      auto& groups = optimizer.param_groups();
      for (size_t g = 0; g < groups.size() && g < lrs.size(); ++g) groups[g].options().set_lr(lrs[g].get<double>());
      continue;
    }
    const bool per_rank = layout == "per_rank";
    if (per_rank && (saved_world != world || state.value("strategy", "") != s.strategy->name()))
      throw Error("load_state: '" + dir.string() + "' holds the state of an optimizer type hasten cannot read, saved by " +
                  std::to_string(saved_world) + " ranks under " + state.value("strategy", "?") +
                  "; it loads only on as many ranks under the same strategy");
    const fs::path file = dir / optimizer_file(i, per_rank ? rank : -1);
    load_optimizer_bytes(optimizer, read_file(file), file.string());
  }
  if (fs::exists(dir / rng_file(rank))) set_rng_state(load_safetensors((dir / rng_file(rank)).string()));
  for (size_t i = 0; i < s.models.size(); ++i) {
    const fs::path file = dir / gradients_file(i, rank);
    if (!fs::exists(file)) continue;
    if (saved_world != world)
      throw Error("load_state: '" + dir.string() + "' was saved in the middle of an accumulation window by " +
                  std::to_string(saved_world) + " ranks; its partial gradients load only on as many ranks");
    std::map<std::string, torch::Tensor> grads;
    for (auto& [name, g] : load_safetensors(file.string())) grads[name] = g;
    torch::NoGradGuard no_grad;
    for (auto& named : s.models[i].module->named_parameters()) {
      auto it = grads.find(named.key());
      if (it == grads.end()) continue;
      torch::Tensor& p = named.value();
      if (p.grad().defined())
        p.mutable_grad().copy_(it->second);
      else
        p.mutable_grad() = it->second.to(p.device()).clone();
    }
  }
  for (size_t i = 0; i < s.checkpoint_objects.size(); ++i) {
    auto& o = s.checkpoint_objects[i];
    const bool tensors = state["custom"][i] == "tensors";
    if (tensors != static_cast<bool>(o.load_tensors))
      throw Error("load_state: registered object " + std::to_string(i) + " saved " + (tensors ? "tensors" : "bytes") +
                  " but now loads " + (tensors ? "bytes" : "tensors"));
    const fs::path file = dir / custom_file(i, tensors);
    if (tensors)
      o.load_tensors(load_safetensors(file.string()));
    else
      o.load_bytes(read_file(file));
  }
  for (size_t id = 0; id < s.loaders.size(); ++id) {
    const json& l = state["loaders"][id];
    LoaderEntry& e = s.loaders[id];
    if (l.value("dataset_size", int64_t{-1}) != e.spec.dataset_size)
      throw Error("load_state: data loader " + std::to_string(id) + " had " + std::to_string(l.value("dataset_size", 0)) +
                  " samples when saved, now " + std::to_string(e.spec.dataset_size));
    e.epoch = l.value("epoch", int64_t{0});
    int64_t next = l.value("next_batch", int64_t{0});
    if (saved_world != world || l.value("batch_size", int64_t{0}) != e.spec.options.batch_size) {
      // Another number of ranks: continue after the samples the saved run had consumed.
      const int64_t consumed = next * l.value("batch_size", int64_t{1}) * saved_world;
      next = consumed / std::max<int64_t>(1, e.spec.options.batch_size * world);
    }
    e.resume_batch = std::min(next, e.num_batches);
  }
  s.accum_step = state["accumulation"].value("step", int64_t{0});
  s.window = state["accumulation"].value("window", int64_t{1});
  if (manifest.contains("checkpoint") && manifest["checkpoint"].is_number_integer())
    s.save_iteration = manifest["checkpoint"].get<int64_t>() + 1;
  // New checkpoints go after every numbered one, damaged or older ones skipped included: an
  // automatic save never collides with a name that exists.
  for (auto& [n, path] : numbered_checkpoints(checkpoints_dir(s.config)))
    s.save_iteration = std::max<int64_t>(s.save_iteration, n + 1);
  wait_for_everyone();
  get_logger()->info("load_state: resumed from {}", dir.string());
  s.resume_settled = true;
  s.resumed_from = dir.string();
  return dir.string();
} catch (const nlohmann::json::exception& e) {
  const std::string what = e.what();
  throw Error("load_state: the checkpoint's " + std::string(kState) + " is malformed (" +
              what.substr(what.find(']') == std::string::npos ? 0 : what.find(']') + 2) + ")");
}

std::string Engine::resume() {
  Impl& s = *impl_;
  if (s.resume_settled) return s.resumed_from;
  s.resume_settled = true;
  if (s.config.resume == "no") return "";
  if (s.config.resume != "auto") return load_state(s.config.resume);
  // auto: a run with no checkpoint yet starts fresh; one with any (even only damaged ones)
  // continues from the newest complete one or says why it cannot.
  const fs::path dir = checkpoints_dir(s.config);
  std::string any = s.process.rank == 0 && !numbered_checkpoints(dir).empty() ? "yes" : "no";
  any = broadcast(any, 0);
  if (any == "no") {
    get_logger()->info("resume: auto: no checkpoint under {} yet; starting fresh", dir.string());
    return "";
  }
  return load_state("");
}

}  // namespace hasten::detail
