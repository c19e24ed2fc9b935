// Collectives on tensors for the Accelerator (gather, reduce, broadcast, all_reduce_,
// reduce_scatter, barrier, the trigger flag) over the run's communicator, and debug mode's
// check that every rank is in the same collective.
#include <hasten/error.hpp>
#include <hasten/plugin_torch.hpp>
#include <hasten/work.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "engine/engine_state.hpp"

namespace hasten::detail {

namespace {

std::string describe(const torch::Tensor& t) {
  if (!t.defined()) return "(no tensor)";
  std::string s = std::string(c10::toString(t.scalar_type())) + "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

hasten_reduce_op to_abi(ReduceOp op) { return static_cast<hasten_reduce_op>(static_cast<int>(op)); }

hasten_reduce_op reduce_op(const std::string& op) {
  if (op == "sum" || op == "mean") return HASTEN_REDUCE_SUM;
  if (op == "max") return HASTEN_REDUCE_MAX;
  if (op == "min") return HASTEN_REDUCE_MIN;
  throw UsageError("reduce: operation '" + op + "' is not allowed (allowed: sum, mean, max, min)");
}

}  // namespace

void Engine::Impl::allreduce_(torch::Tensor& t, hasten_reduce_op op) {
  DLTensor view = sdk::dl_view(t);
  if (auto work = comm->allreduce(view, op, nullptr)) work->wait(0);
}

// Debug mode: before a collective, every rank publishes what it is about to do and checks
// that all ranks agree, so a mismatch is an error naming the ranks instead of a hang.
void Engine::Impl::check_collective(const std::string& op, const torch::Tensor& t) {
  if (!config.debug || process.world_size == 1) return;
  const int64_t n = collective_seq++;
  const std::string mine = op + " " + describe(t);
  const std::string key = "hasten/debug/" + std::to_string(n) + "/";
  try {
    store->set(key + std::to_string(process.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  } catch (const Error& e) {
    // The store lives in rank 0's process: a set that fails means it has gone.
    if (process.rank != 0)
      throw UsageError("debug: rank 0 cannot be asked about collective #" + std::to_string(n) + " (rank " +
                       std::to_string(process.rank) + " is in " + mine + "): the store's host, rank 0, exited or failed (" +
                       e.what() + ")");
    throw;
  }
  std::vector<std::string> differ;
  std::string all;
  for (int r = 0; r < process.world_size; ++r) {
    std::string theirs = wait_for_collective(r, n, mine);
    all += (r ? "; " : "") + std::string("rank ") + std::to_string(r) + ": " + theirs;
    if (theirs != mine) differ.push_back(std::to_string(r));
  }
  if (!differ.empty()) {
    // Every rank names the disagreement, so every rank must read every announcement: rank 0
    // hosts the store in its process, and its process ending with this error before a peer has
    // read them would leave that peer with "the store's host is gone" instead. Each rank says
    // it has read them; the host's process, at its exit, waits for that (bounded, and not for
    // a peer that left), while the error itself goes up at once.
    store->add(key + "read", 1);
    if (process.rank == 0) store->hold_at_exit_until(key + "read", process.world_size);
    throw UsageError("debug: ranks disagree on collective #" + std::to_string(n) + " (" + all + ")");
  }
}

// What rank r announced for collective #n. Waits in short rounds and asks between them
// whether r has left (its Accelerator destroyed, its process gone), so that a peer that
// exited is reported as exited at once, not as late after the full timeout.
std::string Engine::Impl::wait_for_collective(int r, int64_t n, const std::string& mine) {
  const std::string key = "hasten/debug/" + std::to_string(n) + "/" + std::to_string(r);
  const std::string here = "(rank " + std::to_string(process.rank) + " is in " + mine + ")";
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::milliseconds(host.timeout_ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      auto v = store->get(key, std::clamp<int64_t>(left.count(), 1, 500));
      return std::string(v.begin(), v.end());
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("did not appear") == std::string::npos)
        throw UsageError("debug: rank " + std::to_string(r) + " did not reach collective #" + std::to_string(n) + " " +
                         here + ": the store's host, rank 0, exited or failed (" + what + ")");
    }
    if (const std::string why = store->departed(r); !why.empty())
      throw UsageError("debug: rank " + std::to_string(r) + " will not reach collective #" + std::to_string(n) + " " +
                       here + ": " + why);
    if (std::chrono::steady_clock::now() >= deadline)
      throw UsageError("debug: rank " + std::to_string(r) + " did not reach collective #" + std::to_string(n) + " " +
                       here + " within " + c10::str(config.timeout_s) + " s");
  }
}

torch::Tensor Engine::gather(const torch::Tensor& tensor) {
  Impl& s = *impl_;
  torch::Tensor in = (tensor.dim() == 0 ? tensor.reshape({1}) : tensor).contiguous();
  if (s.process.world_size == 1) return in.clone();  // a new tensor, as with several processes
  s.check_collective("gather", in);
  auto sizes = in.sizes().vec();
  sizes[0] *= s.process.world_size;
  torch::Tensor out = torch::empty(sizes, in.options());
  DLTensor a = sdk::dl_view(in), b = sdk::dl_view(out);
  if (auto work = s.comm->allgather(a, b, nullptr)) work->wait(0);
  return out;
}

namespace {

// After a loop over a whole epoch: a tensor of one row per sample the rank was given that
// epoch (its per-batch outputs concatenated) has the round's padding at the end of each rank's
// chunk; the plan says how much each rank got, so only the dataset's samples remain, each once.
// Another shape (per-batch metrics, a partial epoch) comes back as gathered.
torch::Tensor drop_epoch_padding(const torch::Tensor& gathered, const torch::Tensor& mine, const EpochPlan& plan) {
  if (!plan.pad || plan.num_batches == 0 || mine.dim() == 0) return gathered;
  if (plan.batches || plan.dispatch) {
    // A batch sampler's epoch, or a dispatched one: each rank's padding is at the end of its
    // chunk (only its last batch, or its last batches, complete the round), and the plan knows
    // every rank's.
    const int64_t per_rank = plan.rank_samples.at(static_cast<size_t>(plan.rank));
    for (auto n : plan.rank_samples)
      if (n != per_rank) return gathered;  // chunks of different sizes: not one row per sample
    if (mine.size(0) != per_rank || gathered.size(0) != per_rank * plan.world_size) return gathered;
    std::vector<torch::Tensor> keep;
    for (int64_t r = 0; r < plan.world_size; ++r)
      keep.push_back(gathered.narrow(0, r * per_rank, per_rank - plan.rank_padding.at(static_cast<size_t>(r))));
    return torch::cat(keep, 0);
  }
  const int64_t per_rank = plan.num_batches * plan.batch_size;
  if (mine.size(0) != per_rank || gathered.size(0) != per_rank * plan.world_size) return gathered;
  std::vector<torch::Tensor> keep;
  for (int64_t r = 0; r < plan.world_size; ++r) {
    const int64_t start = ((plan.num_batches - 1) * plan.world_size + r) * plan.batch_size;
    const int64_t padding = std::clamp<int64_t>(start + plan.batch_size - std::max(start, plan.dataset_size), 0,
                                                plan.batch_size);
    keep.push_back(gathered.narrow(0, r * per_rank, per_rank - padding));
  }
  return torch::cat(keep, 0);
}

}  // namespace

torch::Tensor Engine::gather_for_metrics(const torch::Tensor& tensor) {
  Impl& s = *impl_;
  // Over the mesh's `dp` group, which the loaders shard over: the ranks of a tensor-parallel
  // group hold the same samples (every process without tensor parallelism).
  const int dp = s.groups->get("dp").group.size();
  auto gather_dp = [&](const torch::Tensor& t) { return dp == s.process.world_size ? gather(t) : group_all_gather("dp", t); };
  torch::Tensor gathered = gather_dp(tensor);
  const ActiveLoader* loader = s.data.innermost();
  if (dp == 1) return gathered;
  if ((loader == nullptr || loader->batch < 0) && s.data.finished)
    return drop_epoch_padding(gathered, tensor, s.data.loaders.at(*s.data.finished).last_plan);
  if (loader == nullptr || loader->batch < 0) return gathered;
  // Drop the padding that completed this round: each rank says how many of its trailing
  // samples pad, and the per-rank chunks are contiguous in rank order.
  torch::Tensor pads = gather_dp(torch::tensor({loader->num_padding}, torch::kLong));
  if (pads.sum().item<int64_t>() == 0) return gathered;
  const int64_t per_rank = tensor.dim() == 0 ? 1 : tensor.size(0);
  std::vector<torch::Tensor> keep;
  for (int64_t r = 0; r < dp; ++r) {
    const int64_t real = std::max<int64_t>(0, per_rank - pads[r].item<int64_t>());
    keep.push_back(gathered.narrow(0, r * per_rank, real));
  }
  return torch::cat(keep, 0);
}

torch::Tensor Engine::reduce(const torch::Tensor& tensor, const std::string& op) {
  Impl& s = *impl_;
  const hasten_reduce_op rop = reduce_op(op);
  torch::Tensor t = tensor.clone().contiguous();
  if (s.process.world_size == 1) return t;
  s.check_collective("reduce(" + op + ")", t);
  s.allreduce_(t, rop);
  if (op == "mean") t = t / static_cast<double>(s.process.world_size);
  return t;
}

torch::Tensor Engine::broadcast(const torch::Tensor& tensor, int from) {
  Impl& s = *impl_;
  if (from < 0 || from >= s.process.world_size)
    throw UsageError("broadcast: from_process " + std::to_string(from) + " is out of range [0, " +
                     std::to_string(s.process.world_size) + ")");
  torch::Tensor t = tensor.clone().contiguous();
  if (s.process.world_size == 1) return t;
  s.check_collective("broadcast(from " + std::to_string(from) + ")", t);
  DLTensor v = sdk::dl_view(t);
  if (auto work = s.comm->broadcast(v, from, nullptr)) work->wait(0);
  return t;
}

std::shared_ptr<PendingWork> Engine::all_reduce_(torch::Tensor& tensor, ReduceOp op) {
  Impl& s = *impl_;
  if (!tensor.is_contiguous()) throw UsageError("all_reduce_: the tensor must be contiguous");
  auto pending = std::make_shared<PendingWork>();
  pending->keep_alive = tensor;
  if (s.process.world_size == 1) return pending;  // one rank: the reduction is the tensor
  s.check_collective("all_reduce_", tensor);
  DLTensor v = sdk::dl_view(tensor);
  pending->work = s.comm->allreduce(v, to_abi(op), nullptr);
  return pending;
}

torch::Tensor Engine::reduce_scatter(const torch::Tensor& tensor, ReduceOp op) {
  Impl& s = *impl_;
  const int64_t w = s.process.world_size;
  if (tensor.dim() == 0 || tensor.size(0) % w != 0)
    throw UsageError("reduce_scatter: dim 0 (" + (tensor.dim() ? std::to_string(tensor.size(0)) : std::string("scalar")) +
                     ") must be a multiple of the " + std::to_string(w) + " processes");
  torch::Tensor in = tensor.contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] /= w;
  torch::Tensor out = torch::empty(sizes, in.options());
  if (w == 1) return out.copy_(in);
  s.check_collective("reduce_scatter", in);
  DLTensor a = sdk::dl_view(in), b = sdk::dl_view(out);
  if (auto work = s.comm->reduce_scatter(a, b, to_abi(op), nullptr)) work->wait(0);
  return out;
}

namespace {

// The checks both *_into collectives share: one line naming what is wrong.
void require_into(const char* op, const torch::Tensor& output, const torch::Tensor& input) {
  if (!output.defined() || !input.defined()) throw UsageError(std::string(op) + ": output and input must be defined tensors");
  if (!output.is_contiguous() || !input.is_contiguous())
    throw UsageError(std::string(op) + ": output and input must be contiguous");
  if (output.scalar_type() != input.scalar_type() || output.device() != input.device())
    throw UsageError(std::string(op) + ": output (" + describe(output) + " on " + output.device().str() + ") and input (" +
                     describe(input) + " on " + input.device().str() + ") must have one dtype and device");
}

}  // namespace

void Engine::all_gather_into(torch::Tensor& output, const torch::Tensor& input) {
  Impl& s = *impl_;
  require_into("all_gather_into", output, input);
  if (output.numel() != input.numel() * s.process.world_size)
    throw UsageError("all_gather_into: output has " + std::to_string(output.numel()) + " elements; it must hold " +
                     std::to_string(s.process.world_size) + " x " + std::to_string(input.numel()) + " (the processes x input)");
  if (s.process.world_size == 1) {
    if (output.data_ptr() != input.data_ptr()) output.view(input.sizes()).copy_(input);
    return;
  }
  s.check_collective("all_gather_into", input);
  DLTensor a = sdk::dl_view(input), b = sdk::dl_view(output);
  if (auto work = s.comm->allgather(a, b, nullptr)) work->wait(0);
}

void Engine::reduce_scatter_into(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  Impl& s = *impl_;
  require_into("reduce_scatter_into", output, input);
  if (input.numel() != output.numel() * s.process.world_size)
    throw UsageError("reduce_scatter_into: input has " + std::to_string(input.numel()) + " elements; it must hold " +
                     std::to_string(s.process.world_size) + " x " + std::to_string(output.numel()) + " (the processes x output)");
  if (s.process.world_size == 1) {
    if (output.data_ptr() != input.data_ptr()) output.copy_(input.view(output.sizes()));
    return;
  }
  s.check_collective("reduce_scatter_into", input);
  DLTensor a = sdk::dl_view(input), b = sdk::dl_view(output);
  if (auto work = s.comm->reduce_scatter(a, b, to_abi(op), nullptr)) work->wait(0);
}

void Engine::broadcast_(torch::Tensor& tensor, int from) {
  Impl& s = *impl_;
  if (from < 0 || from >= s.process.world_size)
    throw UsageError("broadcast_: from_process " + std::to_string(from) + " is out of range [0, " +
                     std::to_string(s.process.world_size) + ")");
  if (!tensor.is_contiguous()) throw UsageError("broadcast_: the tensor must be contiguous");
  if (s.process.world_size == 1) return;
  s.check_collective("broadcast_(from " + std::to_string(from) + ")", tensor);
  DLTensor v = sdk::dl_view(tensor);
  if (auto work = s.comm->broadcast(v, from, nullptr)) work->wait(0);
}

std::string Engine::backend_for(const torch::Device& device) const {
  DLDevice d = sdk::dl_device(device);
  return impl_->comm->backend_for(d);
}

std::string Engine::broadcast(const std::string& text, int from) {
  if (impl_->process.world_size == 1) {
    broadcast(torch::zeros({1}), from);  // validates `from`
    return text;
  }
  torch::Tensor len = broadcast(torch::tensor({static_cast<int64_t>(text.size())}), from);
  const int64_t n = len.item<int64_t>();
  torch::Tensor bytes = torch::zeros({std::max<int64_t>(n, 1)}, torch::kUInt8);
  if (impl_->process.rank == from) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  bytes = broadcast(bytes, from);
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(n));
}

torch::Tensor Engine::pad_across_processes(const torch::Tensor& tensor, int64_t dim,
                                           double pad_value, bool pad_first) {
  Impl& s = *impl_;
  const int64_t ndim = tensor.dim();
  const int64_t d = dim < 0 ? dim + ndim : dim;
  const bool dim_ok = ndim == 0 || (d >= 0 && d < ndim);
  auto out_of_range = [&] {
    return UsageError("pad_across_processes: dim " + std::to_string(dim) + " is out of range for a tensor of " +
                      std::to_string(ndim) + " dimensions (allowed: " + std::to_string(-std::max<int64_t>(ndim, 1)) +
                      " to " + std::to_string(std::max<int64_t>(ndim, 1) - 1) + ")");
  };
  // Accelerate returns the tensor unchanged for an out-of-range dim; hasten refuses it unless
  // the option asks for Accelerate's behaviour.
  const bool keep_out_of_range = s.config.pad_out_of_range_dim == "unchanged";
  if (s.process.world_size == 1) {
    if (!dim_ok && !keep_out_of_range) throw out_of_range();
    return tensor;
  }
  // Every rank says how many dimensions it has, whether dim fits them and its size along
  // dim, in one fixed-size exchange: a rank whose tensor differs in rank (or a bad dim on one
  // rank only) is then an error on every rank, not a hang or garbage from the gather after.
  const torch::Tensor mine = torch::tensor({ndim, int64_t{dim_ok}, ndim == 0 || !dim_ok ? 0 : tensor.size(d)}, torch::kLong);
  const torch::Tensor all = gather(mine).reshape({s.process.world_size, 3});
  std::string ndims;
  bool differ = false, bad_dim = false;
  for (int r = 0; r < s.process.world_size; ++r) {
    ndims += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + ": " + std::to_string(all[r][0].item<int64_t>());
    differ = differ || all[r][0].item<int64_t>() != ndim;
    bad_dim = bad_dim || all[r][1].item<int64_t>() == 0;
  }
  if (differ)
    throw UsageError("pad_across_processes: the ranks' tensors differ in number of dimensions (" + ndims +
                     "); every rank must pass a tensor with the same number of dimensions");
  if (!dim_ok) {
    if (keep_out_of_range) return tensor;
    throw out_of_range();
  }
  if (bad_dim && !keep_out_of_range)
    throw UsageError("pad_across_processes: dim " + std::to_string(dim) + " is out of range on another rank");
  if (ndim == 0) return tensor;
  const int64_t max_size = all.select(1, 2).max().item<int64_t>();
  if (max_size == tensor.size(d)) return tensor;
  auto sizes = tensor.sizes().vec();
  sizes[d] = max_size;
  torch::Tensor out = torch::full(sizes, pad_value, tensor.options());
  const int64_t offset = pad_first ? max_size - tensor.size(d) : 0;
  out.narrow(d, offset, tensor.size(d)).copy_(tensor);
  return out;
}

void Engine::wait_for_everyone() {
  if (impl_->process.world_size == 1) return;
  impl_->check_collective("wait_for_everyone", torch::Tensor());
  impl_->comm->barrier(nullptr);
}

void Engine::set_trigger() { impl_->trigger = true; }

bool Engine::check_trigger() {
  torch::Tensor flag = torch::tensor({impl_->trigger ? int64_t{1} : int64_t{0}});
  const bool raised = reduce(flag, "sum").item<int64_t>() > 0;
  if (raised) impl_->trigger = false;
  return raised;
}

}  // namespace hasten::detail

namespace hasten {

void Work::wait() {
  if (pending_ && pending_->work) pending_->work->wait(pending_->timeout_ms);
}

bool Work::is_completed() { return !pending_ || !pending_->work || pending_->work->test(); }

}  // namespace hasten
