// A checkpoint's optimizer state: the portable layout and LibTorch's archive.
#include "checkpoint/optimizer_state.hpp"

#include <hasten/error.hpp>

#include <c10/util/Type.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <set>
#include <sstream>
#include <tuple>
#include <typeinfo>

#include <hasten/plugin_torch.hpp>
#include <hasten/plugin_optimizer_state.hpp>

#include "parallel/split_parameters.hpp"

namespace hasten::detail {

namespace fs = std::filesystem;

// The optimizer's type, as a checkpoint records it.
std::string optimizer_type(torch::optim::Optimizer& o) {
  if (dynamic_cast<torch::optim::AdamW*>(&o)) return "AdamW";
  if (dynamic_cast<torch::optim::Adam*>(&o)) return "Adam";
  if (dynamic_cast<torch::optim::SGD*>(&o)) return "SGD";
  if (dynamic_cast<torch::optim::RMSprop*>(&o)) return "RMSprop";
  if (dynamic_cast<torch::optim::Adagrad*>(&o)) return "Adagrad";
  if (dynamic_cast<torch::optim::LBFGS*>(&o)) return "LBFGS";
  return c10::demangle(typeid(o).name());
}

std::string optimizer_bytes(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_optimizer_bytes(torch::optim::Optimizer& optimizer, const std::string& bytes, const std::string& file) {
  try {
    // Onto the device of this rank's parameters: the archive would restore each tensor where
    // it was saved (a "full" file is rank 0's, so every rank's state would land on cuda:0).
    c10::Device device = torch::kCPU;
    for (const auto& group : optimizer.param_groups())
      if (!group.params().empty()) {
        device = group.params().front().device();
        break;
      }
    torch::serialize::InputArchive archive;
    std::istringstream in(bytes);
    archive.load_from(in, device);
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    throw Error("load_state: '" + file + "' does not fit the prepared optimizer (another optimizer type or other "
                "parameters?): " + std::string(e.what_without_backtrace()).substr(0, 300));
  }
}

// This rank's optimizer state of model `m`'s parameters in the portable layout (plugin.h,
// strategy slot optimizer_state), names prefixed with "<m>:". Throws Error (unsupported) for
// an optimizer type whose state hasten cannot read.
NamedTensors optimizer_pieces(Engine& engine, StrategyInstance& strategy, int rank, torch::optim::Optimizer& optimizer,
                              torch::nn::Module& module, size_t m) {
  NamedTensors pieces;
  const SplitLayouts splits = strategy.has_optimizer_state() ? SplitLayouts{} : split_layouts(module);
  if (strategy.has_optimizer_state()) {
    pieces = strategy.optimizer_state(optimizer, module);
  } else if (rank == 0 || !splits.empty()) {  // unsharded: every rank holds the same state (or its part)
    std::set<const void*> stepped;
    for (auto& group : optimizer.param_groups())
      for (auto& p : group.params()) stepped.insert(p.unsafeGetTensorImpl());
    for (auto& named : module.named_parameters()) {
      if (!stepped.count(named.value().unsafeGetTensorImpl())) continue;
      const auto split = splits.find(named.key());
      for (auto& [key, value] : sdk::param_state(optimizer, named.value())) {
        torch::Tensor v = value.detach();
        if (split != splits.end() && v.dim() > 0) {
          if (v.sizes() != named.value().sizes())
            throw Error("save_state: the optimizer state '" + named.key() + "/" + key + "' of a tensor-parallel part "
                        "is not shaped like the part, so hasten cannot gather it whole");
          v = gather_whole(engine, v, split->second);
        }
        if (rank != 0) continue;
        if (v.dim() == 0)
          pieces.emplace_back(named.key() + "/" + key, v);
        else
          pieces.emplace_back(named.key() + "/" + key + "@0:" + std::to_string(v.numel()), v.reshape(-1));
      }
    }
  }
  for (auto& [name, value] : pieces) name = std::to_string(m) + ":" + name;
  return pieces;
}

std::map<size_t, NamedTensors> assemble_optimizer(const std::vector<std::pair<std::string, NamedTensors>>& files) {
  struct Full {
    torch::Tensor scalar;
    std::vector<std::tuple<int64_t, torch::Tensor>> pieces;
    int64_t numel = 0;
  };
  std::map<std::string, Full> all;
  for (auto& [file, tensors] : files) {
    for (auto& [name, value] : tensors) {
      const auto at = name.rfind('@');
      if (at == std::string::npos) {
        all[name].scalar = value;
        continue;
      }
      const auto colon = name.find(':', at);
      if (colon == std::string::npos) throw Error("load_state: '" + file + "': malformed piece name '" + name + "'");
      const int64_t offset = std::stoll(name.substr(at + 1, colon - at - 1));
      Full& f = all[name.substr(0, at)];
      f.numel = std::max<int64_t>(f.numel, offset + value.numel());
      f.pieces.emplace_back(offset, value);
    }
  }
  std::map<size_t, NamedTensors> out;
  for (auto& [name, f] : all) {
    const auto colon = name.find(':');
    const size_t model = static_cast<size_t>(std::stoul(name.substr(0, colon)));
    torch::Tensor full = f.scalar;
    if (f.pieces.size() == 1 && std::get<1>(f.pieces.front()).numel() == f.numel) {
      full = std::get<1>(f.pieces.front());  // saved whole (nothing sharded): no copy
    } else if (!f.pieces.empty()) {
      full = torch::zeros({f.numel}, std::get<1>(f.pieces.front()).options());
      for (auto& [offset, piece] : f.pieces) full.narrow(0, offset, piece.numel()).copy_(piece);
    }
    out[model].emplace_back(name.substr(colon + 1), full);
  }
  return out;
}

// Sets the optimizer state of the model's own parameters from full state (unsharded; a
// tensor-parallel part takes its part of the whole).
void set_optimizer_state(torch::optim::Optimizer& optimizer, torch::nn::Module& module, const NamedTensors& full) {
  std::map<std::string, std::map<std::string, torch::Tensor>> by_param;
  for (auto& [name, value] : full) {
    const auto slash = name.rfind('/');
    by_param[name.substr(0, slash)][name.substr(slash + 1)] = value;
  }
  std::set<const void*> stepped;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) stepped.insert(p.unsafeGetTensorImpl());
  const SplitLayouts splits = split_layouts(module);
  for (auto& named : module.named_parameters()) {
    auto it = by_param.find(named.key());
    if (it == by_param.end() || !stepped.count(named.value().unsafeGetTensorImpl())) continue;
    const auto split = splits.find(named.key());
    if (split != splits.end()) {
      // The whole state, flat as saved: this rank's part of it.
      const std::vector<int64_t> whole = whole_shape(named.value().sizes(), split->second);
      for (auto& [key, value] : it->second)
        if (value.dim() > 0) {
          const std::string what = "load_state: optimizer state '" + named.key() + "/" + key + "'";
          if (value.numel() != c10::multiply_integers(whole))
            throw Error(what + " has " + std::to_string(value.numel()) + " elements, the whole parameter " +
                        std::to_string(c10::multiply_integers(whole)));
          value = cut_part(value.reshape(whole), named.value().sizes(), split->second, what);
        }
    }
    for (auto& [key, value] : it->second)
      if (value.dim() > 0 && value.numel() != named.value().numel())
        throw Error("load_state: optimizer state '" + named.key() + "/" + key + "' has " + std::to_string(value.numel()) +
                    " elements, the parameter " + std::to_string(named.value().numel()));
    sdk::set_param_state(optimizer, named.value(), it->second);
  }
}

}  // namespace hasten::detail

namespace hasten::detail {

void set_steps(torch::optim::Optimizer& optimizer, const std::vector<std::pair<torch::Tensor, int64_t>>& steps) {
  std::map<const void*, int64_t> by_data;
  for (auto& [t, n] : steps) by_data[t.data_ptr()] = n;
  auto owner_step = [&](const torch::Tensor& t) -> const int64_t* {
    if (!t.defined()) return nullptr;
    auto it = by_data.find(t.data_ptr());
    return it == by_data.end() ? nullptr : &it->second;
  };
  for (auto& [key, state] : optimizer.state()) {
    (void)key;
    auto* base = state.get();
    if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(base)) {
      if (auto* n = owner_step(s->exp_avg())) s->step(*n);
    } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(base)) {
      if (auto* n = owner_step(s->exp_avg())) s->step(*n);
    } else if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(base)) {
      if (auto* n = owner_step(s->square_avg())) s->step(*n);
    } else if (auto* s = dynamic_cast<torch::optim::AdagradParamState*>(base)) {
      if (auto* n = owner_step(s->sum())) s->step(*n);
    }
  }
}

}  // namespace hasten::detail
