// Prepared data loaders as the engine tracks them: their shard specs, epochs, and which
// loader is iterating at which batch (for end-of-data and gather_for_metrics).
#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "engine/engine_state.hpp"

namespace hasten::detail {

namespace {
// Dispatching reads on rank 0 and broadcasts to every process, each keeping the slice of its
// `dp` rank: under tensor parallelism every tp rank of dp rank 0 would read too. Refused until
// dispatch reads on one rank per tp group.
void refuse_dispatch_under_tensor_parallelism(const ProcessGroups& groups, bool dispatch) {
  if (dispatch && groups.layout().size("tp") > 1)
    throw UsageError("prepare: dispatch_batches under tensor parallelism (tp " +
                     std::to_string(groups.layout().size("tp")) +
                     ") is not supported yet; set dispatch_batches: false (a stream loader then reads on every "
                     "process, each its own shard)");
}
}  // namespace

size_t Engine::add_loader(int64_t dataset_size, const DataLoaderOptions& options) {
  Impl& s = *impl_;
  LoaderEntry e;
  e.spec.dataset_size = dataset_size;
  e.spec.options = options;
  // Sharded over the mesh's `dp` group (every process by default): the ranks of a
  // tensor-parallel group read the same samples.
  e.spec.world_size = s.groups->get("dp").group.size();
  e.spec.rank = s.groups->get("dp").group.rank;
  e.spec.even_batches = options.even_batches.value_or(s.config.even_batches);
  e.spec.split_batches = options.split_batches.value_or(s.config.split_batches);
  // Accelerate's default: a map-style loader is sharded, not dispatched.
  e.spec.dispatch_batches =
      s.process.world_size > 1 && options.dispatch_batches.value_or(s.config.dispatch_batches.value_or(false));
  refuse_dispatch_under_tensor_parallelism(*s.groups, e.spec.dispatch_batches);
  e.num_batches = count_batches(e.spec);  // validates the spec now, at prepare
  s.data.loaders.push_back(e);
  return s.data.loaders.size() - 1;
}

size_t Engine::add_stream_loader(const DataLoaderOptions& options) {
  Impl& s = *impl_;
  LoaderEntry e;
  e.stream = true;
  e.spec.dataset_size = -1;
  e.spec.options = options;
  // Sharded over the mesh's `dp` group (every process by default): the ranks of a
  // tensor-parallel group read the same samples.
  e.spec.world_size = s.groups->get("dp").group.size();
  e.spec.rank = s.groups->get("dp").group.rank;
  e.spec.even_batches = options.even_batches.value_or(s.config.even_batches);
  e.spec.split_batches = options.split_batches.value_or(s.config.split_batches);
  // Accelerate's default: a stream (IterableDataset) is dispatched from rank 0.
  e.spec.dispatch_batches =
      s.process.world_size > 1 && options.dispatch_batches.value_or(s.config.dispatch_batches.value_or(true));
  refuse_dispatch_under_tensor_parallelism(*s.groups, e.spec.dispatch_batches);
  e.num_batches = make_stream_plan(e.spec, 0).num_batches;  // validates the spec now, at prepare
  s.data.loaders.push_back(e);
  return s.data.loaders.size() - 1;
}

EpochPlan Engine::loader_begin_epoch(size_t loader) { return loader_begin_epoch(loader, 0); }

EpochPlan Engine::loader_begin_epoch(size_t loader, int64_t skip) {
  Impl& s = *impl_;
  if (!s.checkpoints.resume_settled) resume();  // config resume: the loop starts here
  LoaderEntry& e = s.data.loaders.at(loader);
  ShardSpec spec = e.spec;
  if (s.join.even_batches) spec.even_batches = *s.join.even_batches;  // join_uneven_inputs's override
  EpochPlan plan = e.stream ? make_stream_plan(spec, e.epoch) : make_epoch_plan(spec, e.epoch);
  ++e.epoch;
  plan.first_batch = std::exchange(e.resume_batch, 0);  // load_state resumes mid-epoch once
  // skip_first_batches after a load_state that already resumed mid-epoch: the later of the
  // two, so code ported from Accelerate (load_state, then skip the batches it counted) does
  // not skip twice.
  plan.first_batch = std::min(std::max(plan.first_batch, skip), plan.num_batches);
  e.last_plan = plan;
  s.data.active.push_back({loader, plan.first_batch - 1, plan.num_batches, 0});
  s.data.finished.reset();
  return plan;
}

void Engine::loader_at(size_t loader, int64_t batch, int64_t num_batches, int64_t num_padding) {
  for (auto it = impl_->data.active.rbegin(); it != impl_->data.active.rend(); ++it) {
    if (it->id != loader) continue;
    it->batch = batch;
    it->num_batches = num_batches;
    it->num_padding = num_padding;
    return;
  }
}

void Engine::loader_end(size_t loader) noexcept {
  auto& active = impl_->data.active;
  for (auto it = active.rbegin(); it != active.rend(); ++it) {
    if (it->id == loader) {
      const bool whole_epoch = it->batch >= 0 && it->batch + 1 == it->num_batches;
      impl_->data.finished = whole_epoch ? std::optional<size_t>(loader) : std::nullopt;
      active.erase(std::next(it).base());
      return;
    }
  }
}

int64_t Engine::loader_epoch(size_t loader) const {
  const Impl& s = *impl_;
  const LoaderEntry& e = s.data.loaders.at(loader);
  for (const auto& a : s.data.active)
    if (a.id == loader) return e.epoch - 1;  // the epoch under way
  return e.epoch;
}

void Engine::loader_set_epoch(size_t loader, int64_t epoch) {
  Impl& s = *impl_;
  if (epoch < 0) throw UsageError("set_epoch: the epoch must be >= 0, got " + std::to_string(epoch));
  for (const auto& a : s.data.active)
    if (a.id == loader)
      throw UsageError("set_epoch: called while this loader is being iterated; call it before the loop "
                       "(`loader.set_epoch(epoch); for (auto& batch : loader) ...`)");
  if (!s.checkpoints.resume_settled) resume();  // config resume first, so that the two compose
  LoaderEntry& e = s.data.loaders.at(loader);
  // The epoch a checkpoint resumes keeps its position: a loop that calls set_epoch(epoch)
  // before each epoch continues mid-epoch after load_state. Another epoch starts at batch 0.
  if (epoch != e.epoch) e.resume_batch = 0;
  e.epoch = epoch;
}

bool Engine::loader_dispatches(size_t loader) const { return impl_->data.loaders.at(loader).spec.dispatch_batches; }

LoaderState Engine::loader_state(size_t loader) const {
  const Impl& s = *impl_;
  const LoaderEntry& e = s.data.loaders.at(loader);
  // A loop left with `break`: this process's next `for` begins a new epoch, so the saved
  // position does too (only an iteration under way resumes mid-epoch).
  LoaderState state{e.epoch, e.resume_batch};
  for (auto it = s.data.active.rbegin(); it != s.data.active.rend(); ++it)
    if (it->id == loader) {
      // Mid-epoch: the epoch under way, from the batch after the one yielded last.
      state = {e.epoch - 1, it->batch + 1};
      if (state.next_batch >= it->num_batches) state = {e.epoch, 0};
      break;
    }
  return state;
}

void Engine::loader_load_state(size_t loader, const LoaderState& state) {
  Impl& s = *impl_;
  if (state.epoch < 0 || state.next_batch < 0)
    throw UsageError("load_state_dict: the epoch and the batch must be >= 0, got epoch " + std::to_string(state.epoch) +
                     ", batch " + std::to_string(state.next_batch));
  for (const auto& a : s.data.active)
    if (a.id == loader)
      throw UsageError("load_state_dict: called while this loader is being iterated; call it before the loop");
  if (!s.checkpoints.resume_settled) resume();  // config resume first: the state given wins
  LoaderEntry& e = s.data.loaders.at(loader);
  e.epoch = state.epoch;
  e.resume_batch = std::min(state.next_batch, e.num_batches);
}

int64_t Engine::loader_num_batches(size_t loader) const {
  const LoaderEntry& e = impl_->data.loaders.at(loader);
  if (!impl_->join.even_batches || *impl_->join.even_batches == e.spec.even_batches) return e.num_batches;
  ShardSpec spec = e.spec;
  spec.even_batches = *impl_->join.even_batches;
  return count_batches(spec);
}

}  // namespace hasten::detail
