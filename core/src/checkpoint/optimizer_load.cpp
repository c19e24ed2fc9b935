// load_state's optimizer phase (checkpoint_load.hpp): LibTorch's archive as saved, or the
// portable pieces, read in place where this rank's layout is unchanged, else assembled from every
// saved rank's pieces and re-sliced for this run.
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/safetensors.hpp>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/cuda.h>
#include <nlohmann/json.hpp>
#include <filesystem>
#include <limits>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <hasten/plugin_torch.hpp>
#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/checkpoint_layout.hpp"
#include "checkpoint/checkpoint_load.hpp"
#include "checkpoint/checkpoint_reader.hpp"
#include "checkpoint/checkpoint_state_check.hpp"
#include "checkpoint/optimizer_state.hpp"
#include "engine/engine_state.hpp"

namespace hasten::detail {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace checkpoint_layout;

namespace {

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

void Engine::Impl::CheckpointLoad::load_optimizer(size_t i) {
  torch::optim::Optimizer& optimizer = *s_.optimizers[i].optimizer;
  const std::string saved_layout = layout(i);
  if (saved_layout != "portable") {
    attempt([&] {
      const std::string name = optimizer_file(i, saved_layout == "per_rank" ? rank_ : -1);
      load_optimizer_bytes(optimizer, read_checked_bytes(dir_, name, manifest_), (dir_ / name).string());
    });
    agree();
    return;
  }
  bool reshard = !same_layout_;
  if (same_layout_) {
    std::set<std::string> read_names;
    attempt([&] { read_own_pieces(i, read_names); });
    agree();
    // The same number of ranks under the same strategy almost always means the same
    // layout; a changed program (other units) does not. Every piece this rank now holds
    // must be one it read, else the state is assembled from every rank's pieces.
    bool covered = true;
    if (s_.strategy->has_optimizer_state())
      for (size_t m = 0; m < s_.models.size(); ++m)
        for (auto& [n, t] : optimizer_pieces(engine_, *s_.strategy, rank_, optimizer, *s_.models[m].module, m))
          covered = covered && (t.dim() == 0 || read_names.count(n) > 0);
    reshard = any_rank(!covered);
  }
  if (reshard) {
    attempt([&] { read_all_pieces(i); });
    agree();
  }
}

void Engine::Impl::CheckpointLoad::read_own_pieces(size_t i, std::set<std::string>& read_names) {
  torch::optim::Optimizer& optimizer = *s_.optimizers[i].optimizer;
  std::map<std::string, torch::Tensor> live, live_of_param;  // this rank's state tensors, as saved
  for (size_t m = 0; m < s_.models.size(); ++m)
    for (auto& [n, t] : optimizer_pieces(engine_, *s_.strategy, 0, optimizer, *s_.models[m].module, m))
      if (t.dim() > 0) {
        live[n] = t;
        live_of_param[n.substr(0, n.rfind('/'))] = t;
      }
  std::string name = optimizer_pieces_file(i, rank_);
  if (!s_.strategy->has_optimizer_state() || !manifest_["files"].contains(name)) name = optimizer_pieces_file(i, 0);
  if (!manifest_["files"].contains(name)) return;  // nothing was saved: never stepped
  SafetensorsHeader header;
  try {
    header = read_safetensors_header((dir_ / name).string());
  } catch (const Error&) {
    read_checked(dir_, name, manifest_);  // says "corrupt" when the checksum does not match
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
    const NamedTensors read = read_checked(dir_, name, manifest_, [&](const SafetensorsEntry& e) {
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
  std::map<std::string, torch::Tensor> full;  // "<m>:<param>/<key>" -> full-size 1-D
  const NamedTensors read = read_checked(dir_, name, manifest_, [&](const SafetensorsEntry& e) -> torch::Tensor {
    PieceName p;
    if (!parse_piece(e.name, p)) return {};
    auto n = saved_numel_.find(p.base.substr(0, p.base.rfind('/')));
    if (n == saved_numel_.end() || p.offset < 0 || p.length != c10::multiply_integers(e.shape) ||
        p.offset + p.length > n->second)
      throw Error("load_state: '" + (dir_ / name).string() + "': the optimizer state piece '" + e.name +
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
  for (size_t m = 0; m < s_.models.size(); ++m)
    if (by_model.count(m)) set_state(optimizer, m, by_model[m]);
}

void Engine::Impl::CheckpointLoad::read_all_pieces(size_t i) {
  std::vector<std::pair<std::string, NamedTensors>> files;
  for (int r = 0; r < saved_world_; ++r) {
    const std::string name = optimizer_pieces_file(i, r);
    if (manifest_["files"].contains(name)) files.emplace_back((dir_ / name).string(), read_checked(dir_, name, manifest_));
  }
  auto full = assemble_optimizer(files);
  files.clear();
  for (size_t m = 0; m < s_.models.size(); ++m) set_state(*s_.optimizers[i].optimizer, m, full[m]);
}

void Engine::Impl::CheckpointLoad::set_state(torch::optim::Optimizer& optimizer, size_t m, const NamedTensors& full) {
  if (s_.strategy->has_load_optimizer_state())
    s_.strategy->load_optimizer_state(optimizer, *s_.models[m].module, full);
  else
    set_optimizer_state(optimizer, *s_.models[m].module, full);
}

}  // namespace hasten::detail
