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
#include "checkpoint_reader.hpp"
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
    if (it->second->data_ptr() != target.data_ptr()) target.copy_(*it->second);  // else read in place
    by_name.erase(it);
  };
  for (auto& named : module.named_parameters()) load(named.key(), named.value());
  for (auto& named : module.named_buffers()) load(named.key(), named.value());
  if (!by_name.empty())
    throw Error("load_state: '" + file + "' has '" + by_name.begin()->first + "', which the model does not");
}

fs::path checkpoints_dir(const Config& c) { return fs::path(c.project_dir) / "checkpoints"; }

// An optimizer piece's name, "<m>:<param>/<key>@<offset>:<length>": base "<m>:<param>/<key>".
struct PieceName {
  std::string base;
  int64_t offset = 0, length = 0;
};
bool parse_piece(const std::string& name, PieceName& out) {
  const auto at = name.rfind('@');
  if (at == std::string::npos) return false;
  const auto colon = name.find(':', at);
  if (colon == std::string::npos) return false;
  try {
    out.offset = std::stoll(name.substr(at + 1, colon - at - 1));
    out.length = std::stoll(name.substr(colon + 1));
  } catch (const std::exception&) {
    return false;
  }
  out.base = name.substr(0, at);
  return true;
}

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
        files.push_back(write_file(
            tmp, model_file(i), [&](const ByteSink& sink) { write_safetensors(full, {{"format", "pt"}}, sink); },
            kChunkSize));  // chunk checksums: a sharding strategy's ranks read only their slices
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
  // state: each rank's own, not yet synchronised ones, as its parameters' .grad show them
  // (under zero and fsdp, views of the unit's full local gradient buffer, kept until the
  // window's synchronising micro-batch reduces it). Loading sets them back as .grad, which
  // the strategy takes into its buffers at the next backward.
  const bool mid_window = s.accum_step % std::max(1, s.config.gradient_accumulation_steps) != 0;
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
      const LoaderState position = loader_state(id);
      loaders.push_back({{"epoch", position.epoch},
                         {"next_batch", position.next_batch},
                         {"num_batches", e.num_batches},
                         {"dataset_size", e.spec.dataset_size},
                         {"batch_size", e.spec.options.batch_size},
                         {"world_size", world}});
    }
    json schedulers = json::array();
    json adjustments = json::array();  // adjust_scheduler's micro-batch counts (bounded schedules)
    for (auto& sc : s.schedulers) {
      schedulers.push_back(sc.steps);
      adjustments.push_back(sc.adjustments);
    }
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
                  {"scheduler_adjustments", adjustments},
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
  const bool sharded = s.strategy->has_load_state_dict();  // it shards parameters and optimizer state

  // One checkpoint, read once: every rank reads only the files it needs, each front to back,
  // verifying its checksum as the bytes arrive (checkpoint_reader.cpp). Nothing but
  // parameters and optimizer state tensors changes until every rank has read and verified
  // all it needs; a damaged file (CorruptCheckpointFile, on every rank alike) then leaves the
  // rest untouched and the caller may load another checkpoint, which overwrites those tensors.
  auto load_from = [&](const fs::path& dir) {
    const json manifest = read_manifest(dir);
    const json state = json::parse(read_checked_bytes(dir, kState, manifest), nullptr, false);
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
    for (size_t k = 0; k < s.schedulers.size(); ++k)
      if (s.schedulers[k].steps > state["schedulers"][k].get<int64_t>())
        throw Error("load_state: scheduler " + std::to_string(k) + " has taken " + std::to_string(s.schedulers[k].steps) +
                    " steps, more than the checkpoint's " + std::to_string(state["schedulers"][k].get<int64_t>()) +
                    "; call load_state before training");
    for (size_t i = 0; i < s.optimizers.size(); ++i) {
      const std::string saved_type = state["optimizers"]["types"].at(i).get<std::string>();
      if (saved_type != optimizer_type(*s.optimizers[i].optimizer))
        throw Error("load_state: optimizer " + std::to_string(i) + " was " + saved_type + " when saved, this program prepared " +
                    optimizer_type(*s.optimizers[i].optimizer) + " ('" + dir.string() + "')");
      const std::string layout = state["optimizers"]["layouts"].at(i).get<std::string>();
      if (layout == "per_rank" && (saved_world != world || state.value("strategy", "") != s.strategy->name()))
        throw Error("load_state: '" + dir.string() + "' holds the state of an optimizer type hasten cannot read, saved by " +
                    std::to_string(saved_world) + " ranks under " + state.value("strategy", "?") +
                    "; it loads only on as many ranks under the same strategy");
    }
    for (size_t i = 0; i < s.checkpoint_objects.size(); ++i) {
      const bool tensors = state["custom"][i] == "tensors";
      if (tensors != static_cast<bool>(s.checkpoint_objects[i].load_tensors))
        throw Error("load_state: registered object " + std::to_string(i) + " saved " + (tensors ? "tensors" : "bytes") +
                    " but now loads " + (tensors ? "bytes" : "tensors"));
    }
    for (size_t id = 0; id < s.loaders.size(); ++id) {
      const json& l = state["loaders"][id];
      if (l.value("dataset_size", int64_t{-1}) != s.loaders[id].spec.dataset_size)
        throw Error("load_state: data loader " + std::to_string(id) + " had " + std::to_string(l.value("dataset_size", 0)) +
                    " samples when saved, now " + std::to_string(s.loaders[id].spec.dataset_size));
    }

    // A failure on one rank is every rank's: each phase ends with all ranks agreeing, before
    // anything collective runs, so that no rank waits for one that stopped.
    std::string failure;  // "corrupt:<line>" or "error:<line>"
    auto attempt = [&](const std::function<void()>& fn) {
      if (!failure.empty()) return;
      try {
        fn();
      } catch (const CorruptCheckpointFile& e) {
        failure = std::string("corrupt:") + e.what();
      } catch (const std::exception& e) {
        failure = std::string("error:") + e.what();
      }
    };
    auto agree = [&] {
      torch::Tensor failed = torch::full({1}, failure.empty() ? 0.0 : static_cast<double>(rank + 1), torch::kDouble);
      s.allreduce_(failed, HASTEN_REDUCE_MAX);
      const int who = static_cast<int>(failed.item<double>()) - 1;
      if (who < 0) return;
      const std::string line = broadcast(failure, who);
      if (line.rfind("corrupt:", 0) == 0) throw CorruptCheckpointFile(line.substr(8));
      throw Error(line.substr(line.find(':') + 1));
    };
    auto any_rank = [&](bool mine) {
      torch::Tensor flag = torch::full({1}, mine ? 1.0 : 0.0, torch::kDouble);
      s.allreduce_(flag, HASTEN_REDUCE_MAX);
      return flag.item<double>() > 0;
    };

    // Models. Unsharded: straight into the parameters and buffers where they can take the
    // bytes as they are. Sharded: full tensors, which the strategy slices (any number of ranks).
    std::vector<NamedTensors> model_tensors(s.models.size());
    // "<m>:<param>" -> its number of elements as saved (a sharding strategy's parameters may
    // be freed, empty tensors, at rest): the size of each full optimizer state tensor.
    std::map<std::string, int64_t> saved_numel;
    std::vector<bool> loaded_in_ranges(s.models.size(), false);
    for (size_t i = 0; i < s.models.size(); ++i)
      attempt([&] {
        if (sharded && s.strategy->has_load_state_dict_ranges() && RangedFile::available(manifest, model_file(i))) {
          // Each rank reads only the ranges its strategy keeps (ABI 1.5), verifying the chunks
          // it touches; the names are checked here, the shapes as the strategy asks.
          RangedFile file(dir, model_file(i), manifest);
          std::map<std::string, const SafetensorsEntry*> entries;
          for (auto& e : file.header().tensors) {
            entries[e.name] = &e;
            saved_numel[std::to_string(i) + ":" + e.name] = c10::multiply_integers(e.shape);
          }
          torch::nn::Module& module = *s.models[i].module;
          std::set<std::string> names;
          for (auto& named : module.named_parameters()) names.insert(named.key());
          for (auto& named : module.named_buffers()) names.insert(named.key());
          for (auto& n : names)
            if (!entries.count(n)) throw Error("load_state: '" + file.path() + "' has no tensor '" + n + "', which the model has");
          for (auto& [n, e] : entries)
            if (!names.count(n)) throw Error("load_state: '" + file.path() + "' has '" + n + "', which the model does not");
          torch::NoGradGuard no_grad;
          s.strategy->load_state_dict_ranges(module, [&](const std::string& name, c10::IntArrayRef shape, int64_t offset,
                                                         torch::Tensor& dst) {
            auto it = entries.find(name);
            if (it == entries.end())
              throw Error("load_state: '" + file.path() + "' has no tensor '" + name + "', which the model has");
            if (c10::IntArrayRef(it->second->shape) != shape)
              throw Error("load_state: '" + file.path() + "': '" + name + "' has shape " +
                          c10::str(c10::IntArrayRef(it->second->shape)) + ", the model's is " + c10::str(shape));
            file.read(*it->second, offset, dst);
          });
          loaded_in_ranges[i] = true;
          return;
        }
        if (sharded) {
          model_tensors[i] = read_checked(dir, model_file(i), manifest);
          for (auto& [n, t] : model_tensors[i]) saved_numel[std::to_string(i) + ":" + n] = t.numel();
          return;
        }
        torch::nn::Module& module = *s.models[i].module;
        std::map<std::string, torch::Tensor> own;
        for (auto& named : module.named_parameters()) own[named.key()] = named.value().detach();
        for (auto& named : module.named_buffers()) own[named.key()] = named.value().detach();
        const NamedTensors read = read_checked(dir, model_file(i), manifest, [&](const SafetensorsEntry& e) {
          auto it = own.find(e.name);
          return it != own.end() && it->second.sizes() == c10::IntArrayRef(e.shape) ? it->second : torch::Tensor();
        });
        for (auto& [n, t] : read) saved_numel[std::to_string(i) + ":" + n] = t.numel();
        copy_into(module, read, (dir / model_file(i)).string());
      });
    agree();
    if (sharded)
      for (size_t i = 0; i < s.models.size(); ++i)
        if (!loaded_in_ranges[i]) s.strategy->load_state_dict(*s.models[i].module, model_tensors[i]);
    model_tensors.clear();

    // Optimizers.
    const bool same_layout = saved_world == world && state.value("strategy", "") == s.strategy->name();
    for (size_t i = 0; i < s.optimizers.size(); ++i) {
      torch::optim::Optimizer& optimizer = *s.optimizers[i].optimizer;
      const std::string layout = state["optimizers"]["layouts"].at(i).get<std::string>();
      if (layout != "portable") {
        attempt([&] {
          const std::string name = optimizer_file(i, layout == "per_rank" ? rank : -1);
          load_optimizer_bytes(optimizer, read_checked_bytes(dir, name, manifest), (dir / name).string());
        });
        agree();
        continue;
      }
      bool reshard = !same_layout;
      if (same_layout) {
        // This rank's own pieces (the file of rank 0 when the state is not sharded, or when
        // this rank held none), read into the live state tensors when the optimizer has
        // them in that layout already, else into new full-size tensors of which only this
        // rank's range is ever touched.
        std::set<std::string> read_names;
        attempt([&] {
          std::map<std::string, torch::Tensor> live, live_of_param;  // this rank's state tensors, as saved
          for (size_t m = 0; m < s.models.size(); ++m)
            for (auto& [n, t] : optimizer_pieces(*s.strategy, 0, optimizer, *s.models[m].module, m))
              if (t.dim() > 0) {
                live[n] = t;
                live_of_param[n.substr(0, n.rfind('/'))] = t;
              }
          std::string name = optimizer_pieces_file(i, rank);
          if (!s.strategy->has_optimizer_state() || !manifest["files"].contains(name)) name = optimizer_pieces_file(i, 0);
          if (!manifest["files"].contains(name)) return;  // nothing was saved: never stepped
          SafetensorsHeader header;
          try {
            header = read_safetensors_header((dir / name).string());
          } catch (const Error&) {
            read_checked(dir, name, manifest);  // says "corrupt" when the checksum does not match
            throw;
          }
          size_t pieces = 0;
          bool in_place = true;
          for (auto& e : header.tensors) {
            PieceName p;
            if (!parse_piece(e.name, p)) {
              in_place = in_place && e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, "/step") == 0 &&
                         live_of_param.count(e.name.substr(0, e.name.size() - 5));
              continue;
            }
            ++pieces;
            auto it = live.find(e.name);
            in_place = in_place && it != live.end() && it->second.scalar_type() == e.dtype && it->second.is_contiguous() &&
                       it->second.numel() == c10::multiply_integers(e.shape);
          }
          in_place = in_place && pieces == live.size();
          if (in_place) {
            const NamedTensors read = read_checked(dir, name, manifest, [&](const SafetensorsEntry& e) {
              auto it = live.find(e.name);
              return it == live.end() ? torch::Tensor() : it->second;
            });
            std::vector<std::pair<torch::Tensor, int64_t>> steps;
            for (auto& [n, t] : read) {
              read_names.insert(n);
              if (t.dim() == 0) steps.emplace_back(live_of_param.at(n.substr(0, n.size() - 5)), t.item<int64_t>());
            }
            set_steps(optimizer, steps);
            return;
          }
          const std::map<std::string, int64_t>& numel = saved_numel;
          std::map<std::string, torch::Tensor> full;  // "<m>:<param>/<key>" -> full-size 1-D
          const NamedTensors read = read_checked(dir, name, manifest, [&](const SafetensorsEntry& e) -> torch::Tensor {
            PieceName p;
            if (!parse_piece(e.name, p)) return {};
            auto n = numel.find(p.base.substr(0, p.base.rfind('/')));
            if (n == numel.end() || p.offset < 0 || p.length != c10::multiply_integers(e.shape) ||
                p.offset + p.length > n->second)
              throw Error("load_state: '" + (dir / name).string() + "': the optimizer state piece '" + e.name +
                          "' fits no parameter of the checkpoint's model");
            torch::Tensor& f = full[p.base];
            if (!f.defined()) f = torch::empty({n->second}, torch::TensorOptions().dtype(e.dtype));
            return f.narrow(0, p.offset, p.length);
          });
          std::map<size_t, NamedTensors> by_model;
          auto model_of = [](const std::string& n) { return static_cast<size_t>(std::stoul(n.substr(0, n.find(':')))); };
          for (auto& [n, t] : read) {
            read_names.insert(n);
            if (t.dim() == 0) by_model[model_of(n)].emplace_back(n.substr(n.find(':') + 1), t);
          }
          for (auto& [base, t] : full) by_model[model_of(base)].emplace_back(base.substr(base.find(':') + 1), t);
          for (size_t m = 0; m < s.models.size(); ++m) {
            if (!by_model.count(m)) continue;
            if (s.strategy->has_load_optimizer_state())
              s.strategy->load_optimizer_state(optimizer, *s.models[m].module, by_model[m]);
            else
              set_optimizer_state(optimizer, *s.models[m].module, by_model[m]);
          }
        });
        agree();
        // The same number of ranks under the same strategy almost always means the same
        // layout; a changed program (other units) does not. Every piece this rank now holds
        // must be one it read, else the state is assembled from every rank's pieces.
        bool covered = true;
        if (s.strategy->has_optimizer_state())
          for (size_t m = 0; m < s.models.size(); ++m)
            for (auto& [n, t] : optimizer_pieces(*s.strategy, rank, optimizer, *s.models[m].module, m))
              covered = covered && (t.dim() == 0 || read_names.count(n) > 0);
        reshard = any_rank(!covered);
      }
      if (reshard) {
        // Every saved rank's pieces, assembled and re-sliced for this run's ranks and strategy.
        attempt([&] {
          std::vector<std::pair<std::string, NamedTensors>> files;
          for (int r = 0; r < saved_world; ++r) {
            const std::string name = optimizer_pieces_file(i, r);
            if (manifest["files"].contains(name)) files.emplace_back((dir / name).string(), read_checked(dir, name, manifest));
          }
          auto full = assemble_optimizer(files);
          files.clear();
          for (size_t m = 0; m < s.models.size(); ++m) {
            const NamedTensors& mine = full[m];
            if (s.strategy->has_load_optimizer_state())
              s.strategy->load_optimizer_state(optimizer, *s.models[m].module, mine);
            else
              set_optimizer_state(optimizer, *s.models[m].module, mine);
          }
        });
        agree();
      }
    }

    // The rest is read (and verified) before any of it is applied.
    NamedTensors rng;
    std::vector<NamedTensors> grads(s.models.size());
    std::vector<NamedTensors> custom_tensors(s.checkpoint_objects.size());
    std::vector<std::string> custom_bytes(s.checkpoint_objects.size());
    attempt([&] {
      if (manifest["files"].contains(rng_file(rank))) rng = read_checked(dir, rng_file(rank), manifest);
      for (size_t i = 0; i < s.models.size(); ++i) {
        if (saved_world == world) {
          if (manifest["files"].contains(gradients_file(i, rank))) grads[i] = read_checked(dir, gradients_file(i, rank), manifest);
          continue;
        }
        // Another number of ranks: the window's synchronising micro-batch averages the ranks'
        // local gradients, so the saved ranks' part of that average is their mean. Every rank
        // of this run takes that mean as its own partial gradients; the average over this
        // run's ranks then holds exactly the saved part, and the window's remaining
        // micro-batches add their own mean as they would have.
        std::vector<std::string> order;
        std::map<std::string, torch::Tensor> sum;
        bool any = false;
        for (int r = 0; r < saved_world; ++r) {
          if (!manifest["files"].contains(gradients_file(i, r))) continue;
          any = true;
          for (auto& [name, g] : read_checked(dir, gradients_file(i, r), manifest)) {
            auto it = sum.find(name);
            if (it == sum.end()) {
              order.push_back(name);
              sum.emplace(name, g);
            } else if (it->second.sizes() != g.sizes()) {
              throw Error("load_state: '" + (dir / gradients_file(i, r)).string() + "': the gradient of '" + name +
                          "' has shape " + c10::str(g.sizes()) + ", another rank's " + c10::str(it->second.sizes()));
            } else {
              it->second.add_(g);
            }
          }
        }
        if (!any) continue;
        for (auto& name : order) grads[i].emplace_back(name, sum[name].div_(saved_world));
      }
      for (size_t i = 0; i < s.checkpoint_objects.size(); ++i) {
        const bool tensors = static_cast<bool>(s.checkpoint_objects[i].load_tensors);
        if (tensors)
          custom_tensors[i] = read_checked(dir, custom_file(i, true), manifest);
        else
          custom_bytes[i] = read_checked_bytes(dir, custom_file(i, false), manifest);
      }
      // Files no rank of this run reads (the random states of ranks it does not have): rank
      // 0 checks them, so that a damaged checkpoint is refused whatever loads it.
      if (rank == 0)
        for (int r = world; r < saved_world; ++r)
          if (manifest["files"].contains(rng_file(r))) verify_checked(dir, rng_file(r), manifest);
    });
    agree();

    // Everything is verified: the rest of the state changes now. Schedulers first: replaying
    // their steps moves the learning rate, which is then set to exactly what was saved.
    for (size_t k = 0; k < s.schedulers.size(); ++k) {
      const int64_t saved = state["schedulers"][k].get<int64_t>();
      SchedulerEntry& sc = s.schedulers[k];
      for (; sc.steps < saved; ++sc.steps) sc.step_once();
      // Absent from checkpoints written before adjust_scheduler existed: none were counted.
      if (state.contains("scheduler_adjustments")) sc.adjustments = state["scheduler_adjustments"].at(k).get<int64_t>();
    }
    for (size_t i = 0; i < s.optimizers.size(); ++i) {
      if (state["optimizers"]["layouts"].at(i).get<std::string>() != "portable") continue;
      const json& lrs = state["optimizers"]["lr"].at(i);
      auto& groups = s.optimizers[i].optimizer->param_groups();
      for (size_t g = 0; g < groups.size() && g < lrs.size(); ++g) groups[g].options().set_lr(lrs[g].get<double>());
    }
    if (!rng.empty()) set_rng_state(rng);
    for (size_t i = 0; i < s.models.size(); ++i) {
      if (grads[i].empty()) continue;
      std::map<std::string, torch::Tensor> by_name;
      for (auto& [name, g] : grads[i]) by_name[name] = g;
      torch::NoGradGuard no_grad;
      for (auto& named : s.models[i].module->named_parameters()) {
        auto it = by_name.find(named.key());
        if (it == by_name.end()) continue;
        torch::Tensor& p = named.value();
        if (p.grad().defined() && !p.grad().is_sparse())
          p.mutable_grad().copy_(it->second);
        else
          p.mutable_grad() = it->second.to(p.device());
      }
    }
    for (size_t i = 0; i < s.checkpoint_objects.size(); ++i) {
      auto& o = s.checkpoint_objects[i];
      if (o.load_tensors)
        o.load_tensors(custom_tensors[i]);
      else
        o.load_bytes(custom_bytes[i]);
    }
    for (size_t id = 0; id < s.loaders.size(); ++id) {
      const json& l = state["loaders"][id];
      LoaderEntry& e = s.loaders[id];
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
  };

  // Which: rank 0 checks the manifests and the files' sizes (nothing is read yet); without a
  // directory, the newest checkpoint that passes and then loads with every checksum right,
  // saying which ones it skipped and why.
  std::string candidates;
  if (rank == 0) {
    json list = json::array();
    if (!requested.empty()) {
      list.push_back({requested, verify_checkpoint(requested)});
    } else {
      auto all = numbered_checkpoints(checkpoints_dir(s.config));
      for (auto it = all.rbegin(); it != all.rend(); ++it)
        list.push_back({it->second.string(), verify_checkpoint(it->second)});
    }
    candidates = list.dump();
  }
  const json list = json::parse(broadcast(candidates, 0));
  std::vector<std::string> skipped;
  auto warn_skipped = [&] {
    if (rank == 0)
      for (auto& why : skipped) get_logger()->warn("load_state: skipping a checkpoint that cannot be loaded: {}", why);
  };
  std::string loaded;
  for (auto& c : list) {
    const std::string path = c[0].get<std::string>(), why = c[1].get<std::string>();
    if (!requested.empty() && !why.empty()) throw Error("load_state: " + why);
    if (!why.empty()) {
      skipped.push_back(why);
      continue;
    }
    try {
      load_from(path);
      loaded = path;
      break;
    } catch (const CorruptCheckpointFile& e) {
      if (!requested.empty()) throw Error(std::string("load_state: ") + e.what());
      skipped.push_back(e.what());
    }
  }
  warn_skipped();
  if (loaded.empty())
    throw Error("load_state: no complete checkpoint under '" + checkpoints_dir(s.config).string() + "'" +
                (skipped.empty() ? "" : " (" + std::to_string(skipped.size()) + " damaged or incomplete, see above)"));
  // New checkpoints go after every numbered one, damaged or older ones skipped included: an
  // automatic save never collides with a name that exists.
  for (auto& [n, path] : numbered_checkpoints(checkpoints_dir(s.config)))
    s.save_iteration = std::max<int64_t>(s.save_iteration, n + 1);
  wait_for_everyone();
  get_logger()->info("load_state: resumed from {}", loaded);
  s.resume_settled = true;
  s.resumed_from = loaded;
  return loaded;
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
