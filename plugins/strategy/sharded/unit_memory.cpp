// The memory of a sharding strategy's units: their flat buffers freed and allocated (pooled on
// the CPU), parameters gathered into them and released, gradient buffers attached to and taken
// from the parameters, the check that the model still lives in the strategy's storage, and the
// memory report of all of it.
#include "sharded_strategy.hpp"
#include "storage_views.hpp"

#include <hasten/torch_compat.hpp>

#include <algorithm>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace hasten::sharded {

using sdk::Error;

// ---- memory of units ----------------------------------------------------------------------

// Frees the memory of a storage: every tensor sharing the StorageImpl (parameters, gradient
// views, tensors autograd saved) now holds 0 bytes. Only this level returns memory; on the CPU
// the buffer goes to the pool, for the next materialisation of a unit of the same size.
void ShardedStrategy::storage_free(const torch::Tensor& flat) {
  c10::DeviceGuard guard(flat.device());  // a device allocator frees on the current device
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  const size_t nbytes = s->nbytes();
  c10::DataPtr old = s->set_data_ptr(s->allocator()->allocate(0));
  s->set_nbytes(0);
  if (flat.device().is_cpu()) pool_.give(std::move(old), nbytes);
}

// An uninitialised 1-D tensor whose memory comes from the pool (give it back with storage_free).
torch::Tensor ShardedStrategy::pooled_empty(int64_t n, const torch::TensorOptions& options) {
  torch::Tensor t = torch::empty({0}, options);
  storage_alloc(t, static_cast<size_t>(n) * t.element_size());
  rebind(t, t, 0, {n});
  return t;
}

void ShardedStrategy::storage_alloc(const torch::Tensor& flat, size_t nbytes) {
  // The CUDA caching allocator allocates on the current device, not the storage's: make it
  // the storage's, or the memory would sit on another GPU than the tensor claims.
  c10::DeviceGuard guard(flat.device());
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(flat.device().is_cpu() ? pool_.take(s->allocator(), nbytes) : s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

// LibTorch's CPU allocator takes blocks of a unit's parameter sizes from glibc's heap once its
// mmap threshold has risen past them; freed there they stay resident, and a model moved (or
// built) unit by unit would still peak near its full size. Hands them back to the system.
void ShardedStrategy::return_freed_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

void ShardedStrategy::free_params(Unit& u) {
  if (u.gathering) finish_gather(u);  // a prefetch nobody used: complete it, then free
  if (!u.params_live || u.params.empty()) return;
  for (auto& p : u.params) rebind(p, u.flat, 0, {0});  // empty: a bypassed use fails cleanly
  storage_free(u.flat);
  u.params_live = false;
  count_peaks();
}

void ShardedStrategy::begin_gather(Unit& u) {
  if (u.params_live || u.gathering || u.params.empty()) return;
  u.gathering = true;
  storage_alloc(u.flat, static_cast<size_t>(u.padded) * u.flat.element_size());
  count_peaks();
  // From a pinned offloaded shard the copy is enqueued on the current stream, which the
  // allgather is ordered after: no host wait.
  u.staging = u.master.to(u.flat.device(), u.flat.scalar_type(), /*non_blocking=*/u.master.is_pinned());
  DLTensor in = sdk::dl_view(u.staging), out = sdk::dl_view(u.flat);
  const hasten_coll_options within = shard_options();
  collective(host()->allgather(host(), &in, &out, &within, &u.gather_work), "parameter allgather");
  u.gathers_in_call = u.gather_work == nullptr;
}

void ShardedStrategy::finish_gather(Unit& u) {
  if (u.params_live || u.params.empty()) return;
  wait(u.gather_work, "parameter allgather");
  u.gathering = false;
  u.staging = torch::Tensor();
  for (size_t i = 0; i < u.params.size(); ++i) rebind(u.params[i], u.flat, u.offsets[i], u.shapes[i]);
  u.params_live = true;
}

// Starts gathering the unit `step` places from `unit` in the backward plan (+1: the next in
// backward, -1: the next in forward), while `unit` computes; not where the backend finished
// that unit's last gather inside the call: the gather would then run here, overlapping
// nothing, and only keep two units' parameters alive. Every rank runs the same forwards and
// backwards, so every rank prefetches the same units in the same order.
void ShardedStrategy::prefetch_neighbour(Model& m, uint32_t unit, int step) {
  const auto it = std::find(m.plan.begin(), m.plan.end(), unit);
  if (it == m.plan.end()) return;
  const auto at = (it - m.plan.begin()) + step;
  if (at < 0 || at >= static_cast<std::ptrdiff_t>(m.plan.size())) return;
  Unit& next = m.units[m.plan[static_cast<size_t>(at)]];
  if (!next.gathers_in_call) begin_gather(next);
}

void ShardedStrategy::gather_now(Unit& u) {
  begin_gather(u);
  finish_gather(u);
}

void ShardedStrategy::alloc_grads(Unit& u) {
  if (u.grads_live || u.params.empty()) return;
  storage_alloc(u.flat_grad, static_cast<size_t>(u.padded) * u.flat_grad.element_size());
  u.flat_grad.zero_();
  u.grads_live = true;
  attach_grads(u);
  count_peaks();
}

void ShardedStrategy::free_grads(Unit& u) {
  if (!u.grads_live || u.params.empty()) return;
  storage_free(u.flat_grad);
  u.grads_live = false;
  place_placeholders(u);
  count_peaks();
}

// The user's plain `model->zero_grad()` must clear what the prepared optimizer's zero_grad()
// clears, but at rest the reduced gradients live only in this rank's shard, where
// Module::zero_grad() cannot see them. So each parameter keeps a placeholder .grad of its
// shape that costs no memory (an empty sparse tensor: it reads as zeros, which is this rank's
// unreduced local gradient at rest, and a backward outside the strategy adds to it densely).
// Module::zero_grad(false) zeroes it in place, bumping its version; zero_grad(true) resets
// it; take_user_zero_grad() sees either and clears the parameter's part of the shard.
void ShardedStrategy::place_placeholders(Unit& u) {
  torch::NoGradGuard no_grad;
  u.placeholder_version.assign(u.params.size(), 0);
  for (size_t i = 0; i < u.params.size(); ++i) {
    torch::Tensor g = torch::empty(u.shapes[i], u.flat_grad.options().layout(torch::kSparse));
    u.placeholder_version[i] = g._version();
    u.params[i].mutable_grad() = g;
  }
}

// Before anything reads or adds to a unit's gradients (a backward, a step, a clip): a
// parameter whose gradient the user cleared since the strategy last set it has its gradient
// cleared where the strategy keeps it. strip: a backward follows, and the placeholders go
// (LibTorch's AccumulateGrad then hands the strategy a plain dense gradient, as it expects).
void ShardedStrategy::take_user_zero_grad(Unit& u, bool strip) {
  if (u.params.empty()) return;
  if (u.grads_live) {  // the parameters' .grad are views of flat_grad: attach_grad zeroes a reset one
    attach_grads(u);
    return;
  }
  if (u.placeholder_version.size() != u.params.size()) return;
  torch::NoGradGuard no_grad;
  const int64_t mine = static_cast<int64_t>(rank_) * u.shard;
  for (size_t i = 0; i < u.params.size(); ++i) {
    auto& g = u.params[i].mutable_grad();
    const bool placeholder = g.defined() && g.is_sparse();
    const bool cleared = !g.defined() || (placeholder && g._version() != u.placeholder_version[i]);
    if (cleared && u.shard_grad.defined()) {
      int64_t numel = 1;
      for (const int64_t d : u.shapes[i]) numel *= d;
      const int64_t lo = std::max(u.offsets[i], mine), hi = std::min(u.offsets[i] + numel, mine + u.shard);
      if (lo < hi) u.shard_grad.narrow(0, lo - mine, hi - lo).zero_();
    }
    if (strip) {
      if (!g.defined() || placeholder) g = torch::Tensor();
    } else if (cleared) {
      g = torch::empty(u.shapes[i], u.flat_grad.options().layout(torch::kSparse));
      u.placeholder_version[i] = g._version();
    }
  }
  if (strip) u.placeholder_version.clear();
}

void ShardedStrategy::take_user_zero_grad(bool strip) {
  for (auto& m : models_)
    for (auto& u : m->units) take_user_zero_grad(u, strip);
}

// Points every parameter's .grad into the unit's flat gradient buffer, keeping the values of
// a gradient something else produced (a backward that did not go through the strategy).
void ShardedStrategy::attach_grads(Unit& u) {
  for (size_t i = 0; i < u.params.size(); ++i) attach_grad(u, i);
}

void ShardedStrategy::attach_grad(Unit& u, size_t i) {
  if (!u.grads_live) return;
  {
    auto& p = u.params[i];
    char* expected = static_cast<char*>(u.flat_grad.data_ptr()) + u.offsets[i] * u.flat_grad.element_size();
    const auto& g = p.grad();
    torch::Tensor view = alias(u.flat_grad, u.offsets[i], u.shapes[i]);
    if (g.defined() && !g.is_sparse() && g.data_ptr() == expected && g.numel() == view.numel()) return;
    torch::NoGradGuard no_grad;
    if (g.defined() && !g.is_sparse() && g.numel() == view.numel())
      view.copy_(g.reshape(view.sizes()));
    else
      view.zero_();  // reset by the user's zero_grad(set_to_none), or a placeholder: no gradient
    p.mutable_grad() = view;
  }
}

void ShardedStrategy::check_params(const Model& m, const Unit& u) const {
  (void)m;
  if (!u.params_live) return;
  const c10::StorageImpl* mine = u.flat.storage().unsafeGetStorageImpl();
  for (size_t i = 0; i < u.params.size(); ++i)
    if (u.params[i].storage().unsafeGetStorageImpl() != mine)
      throw Error(HASTEN_ERR_INVALID_USAGE,
                  options_.label + ": parameter '" + u.names[i] +
                      "' no longer lives in the strategy's storage: the model was moved (module->to()) or its "
                      "parameters were replaced after prepare; move or load the model before prepare");
}

// ---- the memory report ----------------------------------------------------------------------

namespace {
uint64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? static_cast<uint64_t>(t.numel()) * t.element_size() : 0;
}
}  // namespace

void ShardedStrategy::count_peaks() {
  hasten_memory_report now{};
  now.struct_size = sizeof(now);
  memory_report(now);
}

void ShardedStrategy::memory_report(hasten_memory_report& out) {
  uint64_t params = 0, shards = 0, grads = 0, optimizer = 0;
  for (auto& m : models_) {
    for (auto& p : m->frozen) params += bytes_of(p);
    for (auto& u : m->units) {
      if (u.params.empty()) continue;
      if (u.params_live || u.gathering) params += bytes_of(u.flat);  // a prefetch holds its buffer too
      if (u.staging.defined() && !u.staging.is_same(u.master)) shards += bytes_of(u.staging);
      shards += bytes_of(u.master);
      if (u.grads_live) grads += bytes_of(u.flat_grad);
      if (options_.stage >= 2) grads += bytes_of(u.shard_grad);  // stage 1's is a view of flat_grad
      grads += bytes_of(u.reduced);
    }
  }
  for (auto* o : optimizers_) optimizer += sdk::optimizer_state_bytes(*o);
  peak_.peak_params = std::max(peak_.peak_params, params);
  peak_.peak_param_shards = std::max(peak_.peak_param_shards, shards);
  peak_.peak_grads = std::max(peak_.peak_grads, grads);
  peak_.peak_optimizer = std::max(peak_.peak_optimizer, optimizer);
  out.params = params;
  out.param_shards = shards;
  out.grads = grads;
  out.optimizer = optimizer;
  out.peak_params = peak_.peak_params;
  out.peak_param_shards = peak_.peak_param_shards;
  out.peak_grads = peak_.peak_grads;
  out.peak_optimizer = peak_.peak_optimizer;
}

}  // namespace hasten::sharded
