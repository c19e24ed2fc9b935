#include "sharded_strategy.hpp"
#include "storage_views.hpp"

#include <hasten/torch_compat.hpp>

#include <ATen/core/LegacyTypeDispatch.h>

#include <algorithm>
#include <cmath>

namespace hasten::sharded {

using sdk::Error;

ShardedStrategy::ShardedStrategy(const hasten_host_api* host, Options options)
    : Strategy(host), options_(std::move(options)) {
  const auto info = sdk::process_info(host);
  rank_ = info.rank;
  world_ = info.world_size;
  if (const auto tp = sdk::mesh_group(host, "tp"); tp && tp->size > 1)
    throw Error(HASTEN_ERR_UNSUPPORTED, options_.label + ": sharding a tensor-parallel mesh (tp " + std::to_string(tp->size) +
                                            ") is not supported yet; use strategy ddp with tensor parallelism, or "
                                            "parallelism_config_tp_size 1");
  const auto shard = sdk::mesh_group(host, "dp_shard"), replicate = sdk::mesh_group(host, "dp_replicate");
  // NO_SHARD (stage 0) keeps everything whole: its gradients are averaged over every rank.
  if (options_.stage >= 1 && shard && replicate && shard->size > 1 && replicate->size > 1) {
    rank_ = shard->rank;
    world_ = shard->size;
    shard_group_ = shard->handle;
    replica_ = replicate->rank;
    replicas_ = replicate->size;
    replicate_group_ = replicate->handle;
    if (info.rank == 0)
      sdk::log(host, HASTEN_LOG_INFO, options_.label.c_str(),
               "HSDP: shards within dp_shard groups of " + std::to_string(world_) + " ranks, replicated across " +
                   std::to_string(replicas_) + " dp_replicate groups");
  }
  peak_.struct_size = sizeof(peak_);
}

ShardedStrategy::~ShardedStrategy() {
  for (auto& m : models_)
    for (auto& u : m->units) {
      u.hooks.clear();  // removes the post-hooks
      if (u.reduce_work) host()->work_free(host(), u.reduce_work);
      if (u.gather_work) host()->work_free(host(), u.gather_work);
    }
}

torch::Device ShardedStrategy::shard_device() const {
  return options_.offload_optimizer || options_.offload_params ? torch::Device(torch::kCPU) : device_;
}

void ShardedStrategy::collective(hasten_status st, const char* what) { sdk::check(host(), st, what); }

void ShardedStrategy::wait(hasten_work*& work, const char* what) {
  sdk::wait_and_free(host(), work, options_.label + ": " + what);
}

ShardedStrategy::Model& ShardedStrategy::find(torch::nn::Module& module) {
  for (auto& m : models_)
    if (m->module == &module) return *m;
  throw Error(HASTEN_ERR_INVALID_USAGE, options_.label + ": this model was not prepared");
}

// ---- prepare ------------------------------------------------------------------------------

void ShardedStrategy::broadcast_from_rank0(torch::nn::Module& module) {
  if (world_ == 1) return;
  std::vector<torch::Tensor> all;
  for (auto& p : module.parameters())
    if (!built(p)) all.push_back(p);  // a unit built sharded broadcast its parameters when built
  for (auto& b : module.buffers()) all.push_back(b);
  sdk::broadcast_from_rank0(host(), all);
}

void ShardedStrategy::prepare_model(torch::nn::Module& module, const hasten_model_info& info) {
  device_ = sdk::torch_device(info.device);
  module.to(device_);
  broadcast_from_rank0(module);
  auto model = std::make_unique<Model>();
  model->module = &module;
  build_units(*model, info);
  Model* m = model.get();
  models_.push_back(std::move(model));
  for (uint32_t k = 0; k < m->units.size(); ++k) materialize_unit(*m, k);
  // Peaks count from here: the full model the user built before prepare is not the strategy's.
  peak_ = hasten_memory_report{};
  peak_.struct_size = sizeof(peak_);
  count_peaks();
}

void ShardedStrategy::build_units(Model& m, const hasten_model_info& info) {
  const uint32_t n_units = info.n_units > 0 ? info.n_units : 1;
  m.units.resize(n_units);
  std::vector<torch::nn::Module*> unit_modules(n_units);
  for (uint32_t k = 0; k < n_units; ++k)
    unit_modules[k] = info.units != nullptr ? &sdk::module(info.units[k]) : m.module;
  // Every parameter belongs to the deepest unit whose subtree holds it (modules() is
  // pre-order, so a later unit that holds a parameter lies inside the earlier ones).
  std::map<const void*, uint32_t> owner;
  std::vector<std::set<const torch::nn::Module*>> subtree(n_units);
  for (uint32_t k = 0; k < n_units; ++k) {
    // Not modules(include_self): a unit still inside its constructor (unit_built) is not yet
    // owned by a shared_ptr.
    subtree[k].insert(unit_modules[k]);
    for (auto& sub : unit_modules[k]->modules(/*include_self=*/false)) subtree[k].insert(sub.get());
    for (auto& p : unit_modules[k]->parameters()) {
      auto it = owner.find(p.unsafeGetTensorImpl());
      if (it != owner.end() && k > 0 && subtree[it->second].count(unit_modules[k]) == 0)
        throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                    options_.label + ": a parameter is shared by two units that do not contain each other; "
                                     "shared parameters must belong to a common ancestor unit");
      owner[p.unsafeGetTensorImpl()] = k;
    }
  }
  for (auto& named : m.module->named_parameters()) {
    torch::Tensor p = named.value();
    if (!p.requires_grad()) {
      m.frozen.push_back(p);
      continue;
    }
    Unit& u = m.units[owner.count(p.unsafeGetTensorImpl()) ? owner[p.unsafeGetTensorImpl()] : 0];
    if (!u.params.empty() && (u.params.front().scalar_type() != p.scalar_type() || u.params.front().device() != p.device()))
      throw Error(HASTEN_ERR_UNSUPPORTED, options_.label + ": parameters of one unit must share dtype and device ('" +
                                              named.key() + "')");
    u.offsets.push_back(u.numel);
    u.shapes.push_back(full_shape(p));
    u.numel += c10::multiply_integers(u.shapes.back());
    u.params.push_back(p);
    u.names.push_back(named.key());
  }
  for (uint32_t k = 0; k < n_units; ++k) {
    Unit& u = m.units[k];
    u.module = unit_modules[k];
    if (u.params.empty()) u.params_live = u.grads_live = false;
  }
}

// Moves one unit's parameters into its flat buffer, makes its shard and gradient buffers, and
// (stages 2 and 3) frees what is not kept at rest before the next unit is made: the memory of
// prepare peaks at the user's full model plus one unit, not at three copies of the model.
void ShardedStrategy::materialize_unit(Model& m, uint32_t k) {
  Unit& u = m.units[k];
  if (u.params.empty()) return;
  u.padded = (u.numel + world_ - 1) / world_ * world_;
  u.shard = u.padded / world_;
  const auto options = u.params.front().options().requires_grad(false);
  if (!adopt_built(u, options_.label + ": unit " + std::to_string(k))) {
    torch::NoGradGuard no_grad;
    u.flat = torch::empty({u.padded}, options);
    if (u.padded > u.numel) u.flat.narrow(0, u.numel, u.padded - u.numel).zero_();
    for (size_t i = 0; i < u.params.size(); ++i) {
      u.flat.narrow(0, u.offsets[i], u.params[i].numel()).copy_(u.params[i].reshape(-1));
      rebind(u.params[i], u.flat, u.offsets[i], u.params[i].sizes());  // the user's storage goes
    }
    // Stages 2 and 3 allocate the full gradients for each backward: untouched pages here cost
    // nothing, and the buffer is freed below.
    u.flat_grad = options_.stage >= 2 ? torch::empty({u.padded}, options) : torch::zeros({u.padded}, options);
    if (options_.stage < 2) attach_grads(u);
    if (options_.stage >= 1) {
      u.master = make_master(u);
      if (options_.stage == 1)
        u.shard_grad = alias(u.flat_grad, static_cast<int64_t>(rank_) * u.shard, {u.shard});
      else
        u.shard_grad = torch::zeros({u.shard}, u.master.options());
    }
  }
  Model* mp = &m;
  for (size_t i = 0; i < u.params.size(); ++i) {
    locations_[u.params[i].unsafeGetTensorImpl()] = {mp, k, i};
    u.hooks.emplace_back(u.params[i], [this, mp, k, i] { grad_ready(*mp, k, i); },
                         options_.label + ": parameter '" + u.names[i] + "'");
  }
  // Only now: the AccumulateGrad node records the parameter's shape when it is created.
  if (options_.stage >= 2) free_grads(u);
  if (options_.stage == 3) free_params(u);
  return_freed_memory();  // the user's storage of the unit, now in u.flat or shards
}

void ShardedStrategy::prepare_optimizer(torch::optim::Optimizer& optimizer) {
  optimizers_.push_back(&optimizer);
  if (options_.stage == 0) return;  // every rank steps the full parameters
  // Re-point every parameter at this rank's piece of its unit's master shard.
  for (auto& group : optimizer.param_groups()) {
    std::vector<torch::Tensor> params;
    for (auto& p : group.params()) {
      auto it = locations_.find(p.unsafeGetTensorImpl());
      if (it == locations_.end()) {
        params.push_back(p);
        continue;
      }
      Unit& u = it->second.model->units[it->second.unit];
      const int64_t begin = u.offsets[it->second.index];
      const int64_t end = begin + c10::multiply_integers(u.shapes[it->second.index]);
      const int64_t lo = std::max<int64_t>(begin, static_cast<int64_t>(rank_) * u.shard);
      const int64_t hi = std::min<int64_t>(end, static_cast<int64_t>(rank_ + 1) * u.shard);
      if (lo >= hi) continue;  // the whole parameter lives on other ranks
      const int64_t at = lo - static_cast<int64_t>(rank_) * u.shard;
      torch::Tensor view = alias(u.master, at, {hi - lo});
      view.requires_grad_(true);
      view.mutable_grad() = alias(u.shard_grad, at, {hi - lo});
      views_.push_back(view);
      view_of_[{&optimizer, it->second.model, it->second.unit, it->second.index}] = view;
      params.push_back(view);
    }
    group.params() = params;
  }
  optimizer.state().clear();  // keyed by the old parameters
}

// ---- forward ------------------------------------------------------------------------------

void ShardedStrategy::unit_pre_forward(torch::nn::Module& model, uint32_t unit) {
  Model& m = find(model);
  if (unit >= m.units.size()) throw Error(HASTEN_ERR_INVALID_ARGUMENT, options_.label + ": unknown unit");
  Unit& u = m.units[unit];
  if (std::find(m.forward_order.begin(), m.forward_order.end(), unit) == m.forward_order.end())
    m.forward_order.push_back(unit);
  if (options_.stage == 3) {
    if (unit == 0) {
      // A new forward: units an earlier forward (without a backward) left gathered go now.
      for (uint32_t k = 1; k < m.units.size(); ++k)
        if (m.units[k].users == 0) free_params(m.units[k]);
    }
    ++u.users;
    gather_now(u);
    // The unit that ran after this one in the last forward (the backward plan is that forward
    // reversed). Not in backward: a checkpointed unit's recompute runs its forward there, and
    // the unit after it in forward order has already had its backward.
    if (options_.forward_prefetch && !in_backward_.load()) prefetch_neighbour(m, unit, -1);
  }
  check_params(m, u);
}

void ShardedStrategy::unit_post_forward(torch::nn::Module& model, uint32_t unit, at::Tensor* const* outputs,
                                        uint32_t n_outputs) {
  Model& m = find(model);
  Unit& u = m.units[unit];
  if (options_.stage >= 2 && unit != 0 && !u.params.empty()) {
    // Before this unit's backward: gather its parameters (stage 3) and make room for its
    // full gradients (stages 2 and 3).
    Model* mp = &m;
    for (uint32_t i = 0; i < n_outputs; ++i) {
      at::Tensor& out = *outputs[i];
      if (out.defined() && out.requires_grad())
        out.register_hook([this, mp, unit](const at::Tensor& grad) {
          pre_backward(*mp, unit);
          return grad;
        });
    }
  }
  if (options_.stage == 3) {
    --u.users;
    // A forward without autograd (evaluation under no_grad) has no backward to keep anything
    // for: every unit, the root included, goes back to its shards at once.
    const bool no_backward = !at::GradMode::is_enabled();
    if (u.users == 0 &&
        (no_backward || (unit != 0 && options_.reshard_after_forward && !u.keep_after_forward)))
      free_params(u);
  }
}

// ---- backward -----------------------------------------------------------------------------

void ShardedStrategy::pre_backward(Model& m, uint32_t unit) {
  if (!in_backward_.load()) return;
  Unit& u = m.units[unit];
  if (options_.stage >= 2) {
    // Bound the full gradients alive at once: reductions launched before the latest one are
    // finished (and their full gradients freed) before this unit's are allocated.
    std::lock_guard<std::mutex> lock(m.mutex);
    for (size_t i = 0; i + 1 < m.next; ++i) finish_reduction(m.units[m.plan[i]]);
  }
  if (options_.stage == 3) {
    gather_now(u);
    if (options_.backward_prefetch) prefetch_neighbour(m, unit, +1);  // the unit expected next in backward
  }
  alloc_grads(u);
}

void ShardedStrategy::grad_ready(Model& m, uint32_t unit, size_t param) {
  if (!in_backward_.load()) return;  // a backward not run through Accelerator::backward
  std::lock_guard<std::mutex> lock(m.mutex);
  Unit& u = m.units[unit];
  m.touched = true;
  if (!u.grads_live) alloc_grads(u);  // no pre-backward hook fired (outputs the unit hid)
  attach_grad(u, param);              // a gradient produced outside the buffer is copied in
  if (--u.pending != 0) return;
  // The unit's backward is done: its parameters can go, its gradients be reduced.
  if (options_.stage == 3 && unit != 0) free_params(u);
  if (m.sync) {
    u.ready = true;
    launch_ready(m);
    finish_completed_reductions(m);
  }
}

// Launches ready reductions in the planned order: every rank issues the same collectives in
// the same order whatever order autograd finishes units in (caller holds m.mutex).
void ShardedStrategy::launch_ready(Model& m) {
  while (m.next < m.plan.size() && m.units[m.plan[m.next]].ready) launch(m.units[m.plan[m.next++]]);
}

void ShardedStrategy::launch(Unit& u) {
  if (u.params.empty() || !u.grads_live) return;
  const int ranks = world_ * replicas_;
  if (ranks > 1) u.flat_grad.div_(ranks);  // average as DDP does: divide, then sum
  if (options_.stage >= 2) {
    u.reduced = pooled_empty(u.shard, u.flat_grad.options());
    count_peaks();
    DLTensor in = sdk::dl_view(u.flat_grad), out = sdk::dl_view(u.reduced);
    const hasten_coll_options within = shard_options();
    collective(host()->reduce_scatter(host(), &in, &out, HASTEN_REDUCE_SUM, &within, &u.reduce_work),
               "gradient reduce-scatter");
    if (replicas_ > 1) {
      // HSDP: the shard group's sum, then the replicas' sum of it, issued here in the planned
      // order on every rank (the replicate group's collectives keep one order too).
      wait(u.reduce_work, "gradient reduce-scatter");
      DLTensor v = sdk::dl_view(u.reduced);
      const hasten_coll_options across = sdk::group_options(replicate_group_);
      collective(host()->allreduce(host(), &v, HASTEN_REDUCE_SUM, &across, &u.reduce_work),
                 "gradient allreduce across replicas");
    }
  } else {
    DLTensor v = sdk::dl_view(u.flat_grad);
    collective(host()->allreduce(host(), &v, HASTEN_REDUCE_SUM, nullptr, &u.reduce_work), "gradient allreduce");
  }
}

// Reductions the backend finished inside the call (no work came back: shm) are folded into
// the shards at once, so that a unit's full gradients are freed before the next unit's
// backward allocates its own; a reduction still in flight keeps its buffers until the next
// pre-backward (caller holds m.mutex).
void ShardedStrategy::finish_completed_reductions(Model& m) {
  for (size_t i = 0; i < m.next; ++i) {
    Unit& u = m.units[m.plan[i]];
    if (u.reduce_work == nullptr && u.reduced.defined())
      finish_reduction(u);
  }
}

void ShardedStrategy::finish_reduction(Unit& u) {
  wait(u.reduce_work, options_.stage >= 2 ? "gradient reduce-scatter" : "gradient allreduce");
  if (options_.stage >= 2 && u.reduced.defined()) {
    torch::NoGradGuard no_grad;
    u.shard_grad.add_(u.reduced.to(u.shard_grad.device(), u.shard_grad.scalar_type()));
    storage_free(u.reduced);
    u.reduced = torch::Tensor();
    free_grads(u);
  }
}

void ShardedStrategy::set_gradient_sync(torch::nn::Module& model, bool enabled) { find(model).sync = enabled; }

void ShardedStrategy::before_backward() {
  take_user_zero_grad(/*strip=*/true);
  for (auto& mp : models_) {
    Model& m = *mp;
    std::lock_guard<std::mutex> lock(m.mutex);
    if (!m.forward_order.empty()) {
      // Backward runs the units in the reverse order of the forward just done; units that did
      // not run come last, in index order.
      m.plan.assign(m.forward_order.rbegin(), m.forward_order.rend());
      for (uint32_t k = 0; k < m.units.size(); ++k)
        if (std::find(m.plan.begin(), m.plan.end(), k) == m.plan.end()) m.plan.push_back(k);
      for (auto& u : m.units) u.keep_after_forward = false;
      m.units[m.plan.front()].keep_after_forward = true;  // the last unit is needed right away
      m.forward_order.clear();
    } else if (m.plan.empty()) {
      for (uint32_t k = 0; k < m.units.size(); ++k) m.plan.push_back(static_cast<uint32_t>(m.units.size() - 1 - k));
    }
    m.next = 0;
    m.touched = false;
    for (auto& u : m.units) {
      u.pending = static_cast<int>(u.params.size());
      u.ready = false;
      check_params(m, u);
    }
    alloc_grads(m.units[0]);  // the model's own parameters: backward ends with them
    for (auto& u : m.units) attach_grads(u);
  }
  in_backward_.store(true);
}

void ShardedStrategy::after_backward() {
  in_backward_.store(false);
  for (auto& mp : models_) {
    Model& m = *mp;
    if (m.touched && m.sync) {
      {
        // Units whose parameters this backward did not use: reduce them now, in order.
        std::lock_guard<std::mutex> lock(m.mutex);
        for (auto& u : m.units) u.ready = true;
        launch_ready(m);
      }
      for (auto& u : m.units) finish_reduction(u);
    }
    if (options_.stage == 3)
      for (auto& u : m.units) free_params(u);
    // Units this backward left at rest (unused, or a micro-batch without sync) get their
    // placeholders back, so that a zero_grad() the user calls now is seen.
    for (auto& u : m.units)
      if (!u.grads_live && u.placeholder_version.empty()) place_placeholders(u);
  }
}

// ---- optimizer step -----------------------------------------------------------------------

void ShardedStrategy::before_optimizer_step(torch::optim::Optimizer&) {
  take_user_zero_grad(/*strip=*/false);
  if (options_.gradient_clipping > 0)
    for (auto& m : models_) clip_grad_norm(*m->module, options_.gradient_clipping, 2.0);
}

void ShardedStrategy::after_optimizer_step(torch::optim::Optimizer&) {
  torch::NoGradGuard no_grad;
  for (auto& mp : models_) {
    for (auto& u : mp->units) {
      if (u.params.empty()) continue;
      if (options_.stage == 1) {
        // Other ranks' regions of the full gradient are theirs to use; start them from zero.
        const int64_t lo = static_cast<int64_t>(rank_) * u.shard;
        if (lo > 0) u.flat_grad.narrow(0, 0, lo).zero_();
        if (lo + u.shard < u.padded) u.flat_grad.narrow(0, lo + u.shard, u.padded - lo - u.shard).zero_();
      }
      if (options_.stage == 1 || options_.stage == 2) begin_gather_into_live(u);
    }
    for (auto& u : mp->units)
      if (options_.stage == 1 || options_.stage == 2) wait(u.gather_work, "parameter allgather");
    for (auto& u : mp->units) u.staging = torch::Tensor();
  }
  count_peaks();
}

// Stages 1 and 2: the parameters stay allocated; the updated shards are gathered into them.
void ShardedStrategy::begin_gather_into_live(Unit& u) {
  // The master shard itself when it has the parameters' device and dtype (no copy: the gather
  // only reads it, into another buffer).
  u.staging = u.master.to(u.flat.device(), u.flat.scalar_type(), /*non_blocking=*/u.master.is_pinned());
  DLTensor in = sdk::dl_view(u.staging), out = sdk::dl_view(u.flat);
  const hasten_coll_options within = shard_options();
  collective(host()->allgather(host(), &in, &out, &within, &u.gather_work), "parameter allgather");
}

double ShardedStrategy::clip_grad_norm(torch::nn::Module& module, double max_norm, double norm_type) {
  Model& m = find(module);
  for (auto& u : m.units) take_user_zero_grad(u, /*strip=*/false);
  torch::NoGradGuard no_grad;
  if (options_.stage == 0) {
    std::vector<torch::Tensor> params;
    for (auto& u : m.units)
      for (auto& p : u.params) params.push_back(p);
    return torch::nn::utils::clip_grad_norm_(params, max_norm, norm_type);
  }
  // Each rank's shards cover disjoint pieces: combine their norms across ranks.
  // The sum (or max) stays on the shards' device, in double, unit after unit, and is read once:
  // one device-to-host wait per clip, not one per unit.
  const bool inf = std::isinf(norm_type);
  torch::Tensor local_t;
  for (auto& u : m.units) {
    if (!u.shard_grad.defined()) continue;
    const auto g = u.shard_grad.to(torch::kDouble);
    const torch::Tensor part = inf ? g.abs().max() : g.abs().pow(norm_type).sum();
    local_t = !local_t.defined() ? part : inf ? torch::maximum(local_t, part) : local_t + part;
  }
  const double local = local_t.defined() ? std::max(0.0, local_t.item<double>()) : 0.0;
  // Over the shard group: replicas hold the same shards and would count them again.
  const double combined = sdk::allreduce_scalar(host(), local, inf ? HASTEN_REDUCE_MAX : HASTEN_REDUCE_SUM, shard_group_);
  const double total = inf ? combined : std::pow(combined, 1.0 / norm_type);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0)
    for (auto& u : m.units)
      if (u.shard_grad.defined()) u.shard_grad.mul_(coef);
  return total;
}

}  // namespace hasten::sharded
