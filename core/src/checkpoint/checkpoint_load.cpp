// load_state: reads a checkpoint that save_state wrote (checkpoint_save.cpp) back into the
// prepared models, optimizers, schedulers, loaders and registered objects, on any number of
// ranks under any strategy; resume() applies the config key `resume`. CheckpointLoad reads one
// checkpoint directory in phases (checkpoint_load.hpp); load_state chooses which directory.
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/safetensors.hpp>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/cuda.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include <hasten/plugin_torch.hpp>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/checkpoint_layout.hpp"
#include "checkpoint/checkpoint_machines.hpp"
#include "checkpoint/checkpoint_load.hpp"
#include "checkpoint/checkpoint_reader.hpp"
#include "checkpoint/checkpoint_state_check.hpp"
#include "checkpoint/optimizer_state.hpp"
#include "engine/engine_state.hpp"
#include "parallel/split_parameters.hpp"
#include "util/trace_ranges.hpp"

namespace hasten::detail {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace checkpoint_layout;

namespace {

// "cuda" is the rank's own device's generator (checkpoint_save.cpp); a CPU run ignores it.
// Checkpoints of earlier versions name devices by visible index ("cuda:N"): the rank's device
// takes the entry of its own index, the others are not touched.
void set_rng_state(const NamedTensors& states, const torch::Device& device) {
  for (auto& [name, state] : states) {
    if (name == "cpu") {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    } else if (device.is_cuda() && (name == "cuda" || name == "cuda:" + std::to_string(device.index()))) {
      auto gen = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
  }
}

// Copies full tensors into a module's own parameters and buffers, by name, strictly; a
// tensor-parallel part (`splits`) takes its part of the whole.
void copy_into(torch::nn::Module& module, const NamedTensors& tensors, const std::string& file,
               const SplitLayouts& splits) {
  std::map<std::string, const torch::Tensor*> by_name;
  for (auto& [name, t] : tensors) by_name[name] = &t;
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, torch::Tensor& target) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw Error("load_state: '" + file + "' has no tensor '" + name + "', which the model has");
    if (const auto split = splits.find(name); split != splits.end()) {
      target.copy_(cut_part(*it->second, target.sizes(), split->second, "load_state: '" + file + "': '" + name + "'"));
      by_name.erase(it);
      return;
    }
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

}  // namespace

Engine::Impl::CheckpointLoad::CheckpointLoad(Engine& engine, Impl& s, const fs::path& dir)
    : engine_(engine),
      s_(s),
      dir_(dir),
      rank_(s.process.rank),
      world_(s.process.world_size),
      sharded_(s.strategy->has_load_state_dict()) {  // it shards parameters and optimizer state
  // Each machine may read its own copy (save_on_each_node): a failure here is every rank's
  // at run()'s first agree().
  attempt([&] {
    manifest_ = read_manifest(dir);
    state_ = json::parse(read_checked_bytes(dir, kState, manifest_), nullptr, false);
    validate_state(state_, (dir / kState).string());
    saved_world_ = state_["world_size"].get<int>();
  });
}

void Engine::Impl::CheckpointLoad::run() {
  agree();  // the constructor's reads
  attempt([&] {
    check_machine_copy();
    check();
  });
  agree();
  load_models();
  // Tensor-parallel parts (saved or now): optimizer state is saved whole, and cut per rank.
  same_layout_ = saved_world_ == world_ && state_.value("strategy", "") == s_.strategy->name() &&
                 !any_split_parameters(s_.models) &&
                 state_.value("tp_size", 1) == 1;
  for (size_t i = 0; i < s_.optimizers.size(); ++i) load_optimizer(i);
  attempt([&] { read_rest(); });
  agree();
  apply();
}

void Engine::Impl::CheckpointLoad::check() const {
  auto expect = [&](const char* what, size_t saved, size_t now) {
    if (saved != now)
      throw Error("load_state: the checkpoint holds " + std::to_string(saved) + " " + what + ", this program prepared " +
                  std::to_string(now) + " ('" + dir_.string() + "')");
  };
  expect("models", state_.value("models", size_t{0}), s_.models.size());
  expect("optimizers", state_["optimizers"].value("count", size_t{0}), s_.optimizers.size());
  expect("schedulers", state_["schedulers"].size(), s_.schedulers.size());
  expect("data loaders", state_["loaders"].size(), s_.data.loaders.size());
  expect("objects registered for checkpointing", state_["custom"].size(), s_.checkpoints.objects.size());
  for (size_t k = 0; k < s_.schedulers.size(); ++k)
    if (s_.schedulers[k].steps > state_["schedulers"][k].get<int64_t>())
      throw Error("load_state: scheduler " + std::to_string(k) + " has taken " + std::to_string(s_.schedulers[k].steps) +
                  " steps, more than the checkpoint's " + std::to_string(state_["schedulers"][k].get<int64_t>()) +
                  "; call load_state before training");
  for (size_t i = 0; i < s_.optimizers.size(); ++i) {
    const std::string saved_type = state_["optimizers"]["types"].at(i).get<std::string>();
    if (saved_type != optimizer_type(*s_.optimizers[i].optimizer))
      throw Error("load_state: optimizer " + std::to_string(i) + " was " + saved_type + " when saved, this program prepared " +
                  optimizer_type(*s_.optimizers[i].optimizer) + " ('" + dir_.string() + "')");
    if (layout(i) != "portable" && any_split_parameters(s_.models))
      throw Error("load_state: optimizer " + std::to_string(i) + " (" + saved_type + ") was saved as LibTorch's "
                  "archive (a state hasten cannot read), which cannot be cut into this run's tensor-parallel parts ('" +
                  dir_.string() + "')");
    if (layout(i) == "per_rank" && (saved_world_ != world_ || state_.value("strategy", "") != s_.strategy->name()))
      throw Error("load_state: '" + dir_.string() + "' holds the state of an optimizer type hasten cannot read, saved by " +
                  std::to_string(saved_world_) + " ranks under " + state_.value("strategy", "?") +
                  "; it loads only on as many ranks under the same strategy");
  }
  for (size_t i = 0; i < s_.checkpoints.objects.size(); ++i) {
    const bool tensors = state_["custom"][i] == "tensors";
    if (tensors != static_cast<bool>(s_.checkpoints.objects[i].load_tensors))
      throw Error("load_state: registered object " + std::to_string(i) + " saved " + (tensors ? "tensors" : "bytes") +
                  " but now loads " + (tensors ? "bytes" : "tensors"));
  }
  for (size_t id = 0; id < s_.data.loaders.size(); ++id) {
    const json& l = state_["loaders"][id];
    if (l.value("dataset_size", int64_t{-1}) != s_.data.loaders[id].spec.dataset_size)
      throw Error("load_state: data loader " + std::to_string(id) + " had " + std::to_string(l.value("dataset_size", 0)) +
                  " samples when saved, now " + std::to_string(s_.data.loaders[id].spec.dataset_size));
  }
}

std::string Engine::Impl::CheckpointLoad::layout(size_t optimizer) const {
  return state_["optimizers"]["layouts"].at(optimizer).get<std::string>();
}

void Engine::Impl::CheckpointLoad::attempt(const std::function<void()>& fn) {
  if (!failure_.empty()) return;
  try {
    fn();
  } catch (const CorruptCheckpointFile& e) {
    failure_ = std::string("corrupt:") + e.what();
  } catch (const std::exception& e) {
    failure_ = std::string("error:") + e.what();
  }
}

void Engine::Impl::CheckpointLoad::agree() {
  torch::Tensor failed = torch::full({1}, failure_.empty() ? 0.0 : static_cast<double>(rank_ + 1), torch::kDouble);
  s_.allreduce_(failed, HASTEN_REDUCE_MAX);
  const int who = static_cast<int>(failed.item<double>()) - 1;
  if (who < 0) return;
  const std::string line = engine_.broadcast(failure_, who);
  if (line.rfind("corrupt:", 0) == 0) throw CorruptCheckpointFile(line.substr(8));
  throw Error(line.substr(line.find(':') + 1));
}

bool Engine::Impl::CheckpointLoad::any_rank(bool mine) {
  torch::Tensor flag = torch::full({1}, mine ? 1.0 : 0.0, torch::kDouble);
  s_.allreduce_(flag, HASTEN_REDUCE_MAX);
  return flag.item<double>() > 0;
}

void Engine::Impl::CheckpointLoad::load_models() {
  // Pre-hooks (register_load_state_pre_hook): they may take models they load themselves out.
  const std::vector<bool> read_model = s_.run_state_pre_hooks(false, dir_.string());
  std::vector<NamedTensors> full(s_.models.size());
  std::vector<bool> in_ranges(s_.models.size(), false);
  for (size_t i = 0; i < s_.models.size(); ++i)
    attempt([&] {
      if (!read_model[i]) return;
      if (sharded_ && s_.strategy->has_load_state_dict_ranges() && RangedFile::available(manifest_, model_file(i))) {
        read_model_ranges(i);
        in_ranges[i] = true;
      } else if (sharded_) {
        full[i] = read_checked(dir_, model_file(i), manifest_);
        for (auto& [n, t] : full[i]) saved_numel_[std::to_string(i) + ":" + n] = t.numel();
      } else {
        read_model_in_place(i);
      }
    });
  agree();
  if (sharded_)
    for (size_t i = 0; i < s_.models.size(); ++i)
      if (read_model[i] && !in_ranges[i]) s_.strategy->load_state_dict(*s_.models[i].module, full[i]);
}

void Engine::Impl::CheckpointLoad::read_model_ranges(size_t i) {
  RangedFile file(dir_, model_file(i), manifest_);
  std::map<std::string, const SafetensorsEntry*> entries;
  for (auto& e : file.header().tensors) {
    entries[e.name] = &e;
    saved_numel_[std::to_string(i) + ":" + e.name] = c10::multiply_integers(e.shape);
  }
  torch::nn::Module& module = *s_.models[i].module;
  std::set<std::string> names;
  for (auto& named : module.named_parameters()) names.insert(named.key());
  for (auto& named : module.named_buffers()) names.insert(named.key());
  for (auto& n : names)
    if (!entries.count(n)) throw Error("load_state: '" + file.path() + "' has no tensor '" + n + "', which the model has");
  for (auto& [n, e] : entries)
    if (!names.count(n)) throw Error("load_state: '" + file.path() + "' has '" + n + "', which the model does not");
  torch::NoGradGuard no_grad;
  s_.strategy->load_state_dict_ranges(module, [&](const std::string& name, c10::IntArrayRef shape, int64_t offset,
                                                  torch::Tensor& dst) {
    auto it = entries.find(name);
    if (it == entries.end())
      throw Error("load_state: '" + file.path() + "' has no tensor '" + name + "', which the model has");
    if (c10::IntArrayRef(it->second->shape) != shape)
      throw Error("load_state: '" + file.path() + "': '" + name + "' has shape " +
                  c10::str(c10::IntArrayRef(it->second->shape)) + ", the model's is " + c10::str(shape));
    file.read(*it->second, offset, dst);
  });
}

void Engine::Impl::CheckpointLoad::read_model_in_place(size_t i) {
  torch::nn::Module& module = *s_.models[i].module;
  const SplitLayouts splits = split_layouts(module);  // their wholes are read, then cut
  std::map<std::string, torch::Tensor> own;
  for (auto& named : module.named_parameters())
    if (!splits.count(named.key())) own[named.key()] = named.value().detach();
  for (auto& named : module.named_buffers()) own[named.key()] = named.value().detach();
  const NamedTensors read = read_checked(dir_, model_file(i), manifest_, [&](const SafetensorsEntry& e) {
    auto it = own.find(e.name);
    return it != own.end() && it->second.sizes() == c10::IntArrayRef(e.shape) ? it->second : torch::Tensor();
  });
  for (auto& [n, t] : read) saved_numel_[std::to_string(i) + ":" + n] = t.numel();
  copy_into(module, read, (dir_ / model_file(i)).string(), splits);
}

void Engine::Impl::CheckpointLoad::read_rest() {
  if (manifest_["files"].contains(rng_file(rank_))) rng_ = read_checked(dir_, rng_file(rank_), manifest_);
  grads_.resize(s_.models.size());
  for (size_t i = 0; i < s_.models.size(); ++i) grads_[i] = read_gradients(i);
  custom_tensors_.resize(s_.checkpoints.objects.size());
  custom_bytes_.resize(s_.checkpoints.objects.size());
  for (size_t i = 0; i < s_.checkpoints.objects.size(); ++i) {
    const bool tensors = static_cast<bool>(s_.checkpoints.objects[i].load_tensors);
    if (tensors)
      custom_tensors_[i] = read_checked(dir_, custom_file(i, true), manifest_);
    else
      custom_bytes_[i] = read_checked_bytes(dir_, custom_file(i, false), manifest_);
  }
  // Files no rank of this run reads (the random states of ranks it does not have): rank 0
  // checks them, so that a damaged checkpoint is refused whatever loads it.
  if (rank_ == 0)
    for (int r = world_; r < saved_world_; ++r)
      if (manifest_["files"].contains(rng_file(r))) verify_checked(dir_, rng_file(r), manifest_);
}

void Engine::Impl::CheckpointLoad::apply() {
  for (size_t k = 0; k < s_.schedulers.size(); ++k) {
    const int64_t saved = state_["schedulers"][k].get<int64_t>();
    SchedulerEntry& sc = s_.schedulers[k];
    for (; sc.steps < saved; ++sc.steps) sc.step_once();
    // Absent from checkpoints written before adjust_scheduler existed: none were counted.
    if (state_.contains("scheduler_adjustments")) sc.adjustments = state_["scheduler_adjustments"].at(k).get<int64_t>();
  }
  for (size_t i = 0; i < s_.optimizers.size(); ++i) {
    if (layout(i) != "portable") continue;
    const json& lrs = state_["optimizers"]["lr"].at(i);
    auto& groups = s_.optimizers[i].optimizer->param_groups();
    for (size_t g = 0; g < groups.size() && g < lrs.size(); ++g) groups[g].options().set_lr(lrs[g].get<double>());
  }
  if (!rng_.empty()) set_rng_state(rng_, s_.device);
  for (size_t i = 0; i < s_.models.size(); ++i) apply_gradients(i);
  for (size_t i = 0; i < s_.checkpoints.objects.size(); ++i) {
    auto& o = s_.checkpoints.objects[i];
    if (o.load_tensors)
      o.load_tensors(custom_tensors_[i]);
    else
      o.load_bytes(custom_bytes_[i]);
  }
  for (size_t id = 0; id < s_.data.loaders.size(); ++id) {
    const json& l = state_["loaders"][id];
    LoaderEntry& e = s_.data.loaders[id];
    e.epoch = l.value("epoch", int64_t{0});
    int64_t next = l.value("next_batch", int64_t{0});
    // The ranks the loader was sharded over: the mesh's dp ranks (the world without tp).
    const int64_t saved_shards = l.value("world_size", int64_t{saved_world_}), shards = e.spec.world_size;
    if (saved_shards != shards || l.value("batch_size", int64_t{0}) != e.spec.options.batch_size) {
      // Another number of ranks: continue after the samples the saved run had consumed.
      const int64_t consumed = next * l.value("batch_size", int64_t{1}) * saved_shards;
      next = consumed / std::max<int64_t>(1, e.spec.options.batch_size * shards);
    }
    e.resume_batch = std::min(next, e.num_batches);
  }
  s_.accumulation.step = state_["accumulation"].value("step", int64_t{0});
  s_.accumulation.window = state_["accumulation"].value("window", int64_t{1});
  restore_precision();
  if (manifest_.contains("checkpoint") && manifest_["checkpoint"].is_number_integer())
    s_.checkpoints.save_iteration = manifest_["checkpoint"].get<int64_t>() + 1;
}

// The precision's state (ABI 1.7): a resumed fp16 run continues with the scale the straight
// run has. A checkpoint of another precision, or of one without state, leaves this run's as
// it is and says so: changing precision on resume is allowed, losing a scaler's state quietly
// is not.
void Engine::Impl::CheckpointLoad::restore_precision() {
  if (!s_.precision) return;
  const bool saved = state_.contains("precision");
  const std::string mine = s_.precision->name();
  if (!s_.precision->has_state()) {
    if (saved)
      get_logger()->warn("load_state: the checkpoint holds precision '{}''s state; this run's precision '{}' keeps none",
                         state_["precision"]["plugin"].get<std::string>(), mine);
    return;
  }
  if (!saved) {
    get_logger()->warn("load_state: the checkpoint holds no precision state (saved without one, or by an older "
                       "hasten); precision '{}' starts its own afresh",
                       mine);
    return;
  }
  const std::string theirs = state_["precision"]["plugin"].get<std::string>();
  if (theirs != mine) {
    get_logger()->warn("load_state: the checkpoint holds precision '{}''s state; precision '{}' starts its own afresh",
                       theirs, mine);
    return;
  }
  s_.precision->load_state_dict(state_["precision"]["state"].dump());
}

// A function-try-block: a hand-edited hasten_state.json whose fields have the wrong types
// makes nlohmann throw from anywhere below; it becomes one line naming the file.
std::string Engine::load_state(const std::string& requested) try {
  TraceRange range("hasten::load_state");
  Impl& s = *impl_;
  if (!s.data.active.empty())
    throw UsageError("load_state: called while a prepared data loader is being iterated; call it after prepare and "
                     "before the loop (or set the config key resume: auto)");
  const int rank = s.process.rank;

  // Which: rank 0 checks the manifests and the files' sizes (nothing is read yet); without a
  // directory, the newest checkpoint that passes and then loads with every checksum right,
  // saying which ones it skipped and why.
  std::string candidates;
  if (rank == 0) {
    json list = json::array();
    if (!requested.empty()) {
      if (const std::string recovered = recover_checkpoint(requested); !recovered.empty())
        get_logger()->warn("load_state: {}", recovered);
      list.push_back({requested, verify_checkpoint(requested)});
    } else {
      auto all = numbered_checkpoints(checkpoints_dir(s.config.project_dir));
      for (auto it = all.rbegin(); it != all.rend(); ++it)
        list.push_back({it->second.string(), verify_checkpoint(it->second)});
    }
    candidates = list.dump();
  }
  const json list = json::parse(broadcast(candidates, 0));
  // save_on_each_node across machines: each machine loads its own copy (under its own
  // project_dir where the names are automatic); a candidate is loadable when it is on all.
  const bool each_machine = saving_on_each_machine(*this, s.process, s.config.save_on_each_node, "load_state");
  auto local = [&](const std::string& path) -> fs::path {
    if (!each_machine || !requested.empty()) return path;
    return checkpoints_dir(s.config.project_dir) / fs::path(path).filename();
  };
  std::vector<std::string> machines_why;
  if (each_machine) {
    std::vector<std::pair<std::string, std::string>> pairs;
    for (auto& c : list) pairs.emplace_back(c[0].get<std::string>(), c[1].get<std::string>());
    machines_why = verify_on_each_machine(*this, s.process, pairs, local);
  }
  std::vector<std::string> skipped;
  auto warn_skipped = [&] {
    if (rank == 0)
      for (auto& why : skipped) get_logger()->warn("load_state: skipping a checkpoint that cannot be loaded: {}", why);
  };
  std::string loaded;
  for (size_t k = 0; k < list.size(); ++k) {
    const json& c = list[k];
    const std::string path = local(c[0].get<std::string>()).string();
    const std::string why = each_machine ? machines_why[k] : c[1].get<std::string>();
    if (!requested.empty() && !why.empty()) throw Error("load_state: " + why);
    if (!why.empty()) {
      skipped.push_back(why);
      continue;
    }
    try {
      Impl::CheckpointLoad(*this, s, path).run();
      loaded = path;
      break;
    } catch (const CorruptCheckpointFile& e) {
      if (!requested.empty()) throw Error(std::string("load_state: ") + e.what());
      skipped.push_back(e.what());
    }
  }
  warn_skipped();
  if (loaded.empty())
    throw Error("load_state: no complete checkpoint under '" + checkpoints_dir(s.config.project_dir).string() + "'" +
                (skipped.empty() ? "" : " (" + std::to_string(skipped.size()) + " damaged or incomplete, see above)"));
  // New checkpoints go after every numbered one, damaged or older ones skipped included: an
  // automatic save never collides with a name that exists.
  for (auto& [n, path] : numbered_checkpoints(checkpoints_dir(s.config.project_dir)))
    s.checkpoints.save_iteration = std::max<int64_t>(s.checkpoints.save_iteration, n + 1);
  if (each_machine)  // each machine saw its own directory: the next number is after all of them
    s.checkpoints.save_iteration = static_cast<int64_t>(
        reduce(torch::tensor({static_cast<double>(s.checkpoints.save_iteration)}, torch::kDouble), "max").item<double>());
  wait_for_everyone();
  get_logger()->info("load_state: resumed from {}", loaded);
  s.checkpoints.resume_settled = true;
  s.checkpoints.resumed_from = loaded;
  return loaded;
} catch (const nlohmann::json::exception& e) {
  const std::string what = e.what();
  throw Error("load_state: the checkpoint's " + std::string(kState) + " is malformed (" +
              what.substr(what.find(']') == std::string::npos ? 0 : what.find(']') + 2) + ")");
}

std::string Engine::resume() {
  Impl& s = *impl_;
  if (s.checkpoints.resume_settled) return s.checkpoints.resumed_from;
  s.checkpoints.resume_settled = true;
  if (s.config.resume == "no") return "";
  if (s.config.resume != "auto") return load_state(s.config.resume);
  // auto: a run with no checkpoint yet starts fresh; one with any (even only damaged ones)
  // continues from the newest complete one or says why it cannot.
  const fs::path dir = checkpoints_dir(s.config.project_dir);
  std::string any = s.process.rank == 0 && !numbered_checkpoints(dir).empty() ? "yes" : "no";
  any = broadcast(any, 0);
  if (any == "no") {
    get_logger()->info("resume: auto: no checkpoint under {} yet; starting fresh", dir.string());
    return "";
  }
  return load_state("");
}

}  // namespace hasten::detail
