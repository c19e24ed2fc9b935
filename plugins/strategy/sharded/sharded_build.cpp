// Models built without their full weights (the host's run setting sharded_init: DeepSpeed's
// zero3_init_flag, FSDP's fsdp_cpu_ram_efficient_loading). The host calls unit_built right
// after each hasten::Unit is constructed. At stage 3 the unit then keeps only this rank's
// master shard of the parameters it owns, the shard materialize_unit would have cut from the
// model built whole, and its parameters become 0-element tensors: building a model peaks at
// its shards plus one unit (and the parameters no unit owns) instead of the full model, and
// the run trains bitwise as one built whole (same initialisers, rank 0's values).
#include "sharded_strategy.hpp"
#include "storage_views.hpp"

#include <algorithm>
#include <utility>

namespace hasten::sharded {

using sdk::Error;

std::vector<int64_t> ShardedStrategy::full_shape(const torch::Tensor& param) const {
  const auto it = built_params_.find(param.unsafeGetTensorImpl());
  if (it == built_params_.end()) return param.sizes().vec();
  return it->second.first->shapes[it->second.second];
}

torch::Tensor ShardedStrategy::make_master(const Unit& u) const {
  const torch::Tensor mine = u.flat.narrow(0, static_cast<int64_t>(rank_) * u.shard, u.shard);
  if (shard_device().is_cpu() && !mine.is_cpu()) {
    // Offloaded shards of a GPU model live in pinned memory: each gather copies them to the
    // GPU without a host wait (begin_gather's non-blocking copy).
    torch::Tensor master = torch::empty({u.shard}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true));
    master.copy_(mine);
    return master;
  }
  return mine.to(shard_device(), torch::kFloat, false, true);
}

void ShardedStrategy::unit_built(torch::nn::Module& unit, const hasten_model_info& info) {
  if (options_.stage < 3) {
    // Accelerate warns and builds whole too: below stage 3 parameters are whole at rest.
    if (!std::exchange(warned_whole_build_, true))
      sdk::log(host(), HASTEN_LOG_WARN, options_.label.c_str(),
               "sharded_init (zero3_init_flag, fsdp_cpu_ram_efficient_loading) builds units whole below stage 3 "
               "(FULL_SHARD): parameters are whole at rest there");
    return;
  }
  device_ = sdk::torch_device(info.device);
  Model sub;
  sub.module = &unit;
  build_units(sub, info);  // units[0]: the parameters this unit owns, not its nested units'
  Unit& u = sub.units[0];
  if (u.params.empty()) return;
  for (size_t i = 0; i < u.params.size(); ++i)
    if (built(u.params[i]))
      throw Error(HASTEN_ERR_INVALID_USAGE,
                  options_.label + ": parameter '" + u.names[i] + "' of a unit being built belongs to a unit built "
                  "before it (a weight shared by two units); build this model whole (sharded_init, zero3_init_flag "
                  "and fsdp_cpu_ram_efficient_loading off)");
  u.padded = (u.numel + world_ - 1) / world_ * world_;
  u.shard = u.padded / world_;
  auto built_unit = std::make_unique<Built>();
  {
    torch::NoGradGuard no_grad;
    // Rank 0's values, as prepare_model broadcasts a model built whole (in place, in small
    // buckets: the build holds no second copy of the unit).
    sdk::broadcast_from_rank0(host(), u.params);
    // This rank's piece of the unit's flat layout (materialize_unit's), padding zeroed, cut
    // straight from the parameters.
    const torch::Device to = shard_device();
    built_unit->master = to.is_cpu() && !device_.is_cpu()
                             ? torch::empty({u.shard}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true))
                             : torch::empty({u.shard}, torch::TensorOptions().dtype(torch::kFloat).device(to));
    built_unit->master.zero_();
    const int64_t lo = static_cast<int64_t>(rank_) * u.shard, hi = lo + u.shard;
    for (size_t i = 0; i < u.params.size(); ++i) {
      const int64_t begin = u.offsets[i], end = begin + u.params[i].numel();
      const int64_t a = std::max(lo, begin), b = std::min(hi, end);
      if (a < b) built_unit->master.narrow(0, a - lo, b - a).copy_(u.params[i].reshape(-1).narrow(0, a - begin, b - a));
    }
    for (size_t i = 0; i < u.params.size(); ++i) {
      // The user's storage goes; the parameter keeps its identity (modules and optimizers
      // made before prepare refer to it), its dtype and its device.
      rebind(u.params[i], torch::empty({0}, u.params[i].options().requires_grad(false)), 0, {0});
      built_params_[u.params[i].unsafeGetTensorImpl()] = {built_unit.get(), i};
    }
  }
  return_freed_memory();
  built_unit->params = std::move(u.params);
  built_unit->shapes = std::move(u.shapes);
  built_.push_back(std::move(built_unit));
}

bool ShardedStrategy::adopt_built(Unit& u, const std::string& unit_label) {
  const auto mismatch = [&] {
    return Error(HASTEN_ERR_INVALID_USAGE,
                 unit_label + " holds parameters built sharded as part of another unit (a weight shared by two units, "
                              "or a unit moved after it was built); build this model whole (sharded_init, "
                              "zero3_init_flag and fsdp_cpu_ram_efficient_loading off)");
  };
  if (u.params.empty() || !built(u.params.front())) {
    for (auto& p : u.params)
      if (built(p)) throw mismatch();
    return false;
  }
  Built* b = built_params_.at(u.params.front().unsafeGetTensorImpl()).first;
  if (b->params.size() != u.params.size()) throw mismatch();
  for (size_t i = 0; i < u.params.size(); ++i) {
    const auto it = built_params_.find(u.params[i].unsafeGetTensorImpl());
    if (it == built_params_.end() || it->second != std::make_pair(b, i)) throw mismatch();
  }
  torch::NoGradGuard no_grad;
  const auto options = u.params.front().options().requires_grad(false);
  u.master = b->master.to(shard_device());
  u.shard_grad = torch::zeros({u.shard}, u.master.options());
  u.flat_grad = torch::empty({u.padded}, options);  // freed by materialize_unit
  // Sized, holding no memory: the gather allocates it and points the parameters into it with
  // their full shapes, which their gradient hooks record (materialize_unit frees it again).
  u.flat = pooled_empty(u.padded, options);
  storage_free(u.flat);
  u.params_live = false;
  gather_now(u);
  for (auto& p : u.params) built_params_.erase(p.unsafeGetTensorImpl());
  for (auto it = built_.begin(); it != built_.end(); ++it)
    if (it->get() == b) {
      built_.erase(it);
      break;
    }
  return true;
}

}  // namespace hasten::sharded
