// load_state's partial gradients (checkpoint_load.hpp): a checkpoint saved in the middle of an
// accumulation window holds each rank's gradients so far; they go back as .grad, averaged
// over the saved ranks when the number of ranks changed.
#include <hasten/error.hpp>

#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_layout.hpp"
#include "checkpoint/checkpoint_load.hpp"
#include "checkpoint/checkpoint_reader.hpp"
#include "engine/engine_state.hpp"

namespace hasten::detail {

using namespace checkpoint_layout;

NamedTensors Engine::Impl::CheckpointLoad::read_gradients(size_t i) const {
  // Mid-window gradients are each rank's own, of its tensor-parallel parts: they carry over
  // only to the same mesh.
  const int saved_tp = state_.value("tp_size", 1), tp = s_.groups->layout().size("tp");
  if ((saved_tp > 1 || tp > 1) && (saved_tp != tp || saved_world_ != world_)) {
    bool any = false;
    for (int r = 0; r < saved_world_; ++r) any = any || manifest_["files"].contains(gradients_file(i, r));
    if (any)
      throw Error("load_state: '" + dir_.string() + "' was saved in the middle of an accumulation window by " +
                  std::to_string(saved_world_) + " ranks with tp " + std::to_string(saved_tp) +
                  "; its partial gradients are tensor-parallel parts and load only on the same mesh (this run: " +
                  std::to_string(world_) + " ranks, tp " + std::to_string(tp) +
                  "); save at the end of a window to change it");
  }
  if (saved_world_ == world_) {
    if (!manifest_["files"].contains(gradients_file(i, rank_))) return {};
    return read_checked(dir_, gradients_file(i, rank_), manifest_);
  }
  // Another number of ranks: the window's synchronising micro-batch averages the ranks'
  // local gradients, so the saved ranks' part of that average is their mean. Every rank of
  // this run takes that mean as its own partial gradients; the average over this run's
  // ranks then holds exactly the saved part, and the window's remaining micro-batches add
  // their own mean as they would have.
  std::vector<std::string> order;
  std::map<std::string, torch::Tensor> sum;
  for (int r = 0; r < saved_world_; ++r) {
    if (!manifest_["files"].contains(gradients_file(i, r))) continue;
    for (auto& [name, g] : read_checked(dir_, gradients_file(i, r), manifest_)) {
      auto it = sum.find(name);
      if (it == sum.end()) {
        order.push_back(name);
        sum.emplace(name, g);
      } else if (it->second.sizes() != g.sizes()) {
        throw Error("load_state: '" + (dir_ / gradients_file(i, r)).string() + "': the gradient of '" + name +
                    "' has shape " + c10::str(g.sizes()) + ", another rank's " + c10::str(it->second.sizes()));
      } else {
        it->second.add_(g);
      }
    }
  }
  NamedTensors mean;
  for (auto& name : order) mean.emplace_back(name, sum[name].div_(saved_world_));
  return mean;
}

void Engine::Impl::CheckpointLoad::apply_gradients(size_t i) {
  if (grads_[i].empty()) return;
  std::map<std::string, torch::Tensor> by_name;
  for (auto& [name, g] : grads_[i]) by_name[name] = g;
  torch::NoGradGuard no_grad;
  for (auto& named : s_.models[i].module->named_parameters()) {
    auto it = by_name.find(named.key());
    if (it == by_name.end()) continue;
    torch::Tensor& p = named.value();
    if (p.grad().defined() && !p.grad().is_sparse())
      p.mutable_grad().copy_(it->second);
    else
      p.mutable_grad() = it->second.to(p.device());
  }
}

}  // namespace hasten::detail
