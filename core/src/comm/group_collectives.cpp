// Collectives over one group of the device mesh (DeviceMesh, ProcessGroup): the group's own
// communicator (comm/process_groups.hpp), so processes outside the group take no part.
#include <hasten/error.hpp>
#include <hasten/plugin_torch.hpp>

#include "engine/engine_state.hpp"

namespace hasten::detail {

// Named, not anonymous: the core compiles as unity batches, where collectives.cpp's helpers
// share the translation unit.
namespace group_collectives {

hasten_reduce_op group_op(ReduceOp op) { return static_cast<hasten_reduce_op>(static_cast<int>(op)); }

const ProcessGroups::Entry& group_entry(const ProcessGroups& groups, const std::string& name) { return groups.get(name); }

std::string group_label(const std::string& name, const char* op) { return "group '" + name + "': " + op; }

void group_require_contiguous(const std::string& name, const char* op, const torch::Tensor& t) {
  if (!t.defined() || !t.is_contiguous())
    throw UsageError(group_label(name, op) + ": the tensor must be a defined, contiguous tensor");
}

}  // namespace group_collectives

using group_collectives::group_entry;
using group_collectives::group_label;
using group_collectives::group_require_contiguous;
using group_collectives::group_op;

CommStats Engine::comm_stats() const { return impl_->comm_counters ? impl_->comm_counters->snapshot() : CommStats{}; }

std::vector<std::pair<std::string, int>> Engine::mesh_dims() const { return impl_->groups->layout().dims(); }

MeshGroupView Engine::mesh_group(const std::string& name) const {
  const auto& e = group_entry(*impl_->groups, name);
  return MeshGroupView{e.group.ranks, e.group.rank};
}

void Engine::group_all_reduce_(const std::string& name, torch::Tensor& tensor, ReduceOp op) {
  const auto& e = group_entry(*impl_->groups, name);
  group_require_contiguous(name, "all_reduce_", tensor);
  if (e.group.size() == 1) return;  // sum, avg, min and max of one value are that value
  DLTensor v = sdk::dl_view(tensor);
  if (auto work = e.comm->allreduce(v, group_op(op), nullptr)) work->wait(0);
}

torch::Tensor Engine::group_all_gather(const std::string& name, const torch::Tensor& tensor) {
  const auto& e = group_entry(*impl_->groups, name);
  if (!tensor.defined()) throw UsageError(group_label(name, "all_gather") + ": the tensor is undefined");
  torch::Tensor in = (tensor.dim() == 0 ? tensor.reshape({1}) : tensor).contiguous();
  if (e.group.size() == 1) return in.clone();  // a new tensor, as with several members
  auto sizes = in.sizes().vec();
  sizes[0] *= e.group.size();
  torch::Tensor out = torch::empty(sizes, in.options());
  DLTensor a = sdk::dl_view(in), b = sdk::dl_view(out);
  if (auto work = e.comm->allgather(a, b, nullptr)) work->wait(0);
  return out;
}

torch::Tensor Engine::group_reduce_scatter(const std::string& name, const torch::Tensor& tensor, ReduceOp op) {
  const auto& e = group_entry(*impl_->groups, name);
  const int64_t n = e.group.size();
  if (!tensor.defined() || tensor.dim() == 0 || tensor.size(0) % n != 0)
    throw UsageError(group_label(name, "reduce_scatter") + ": dim 0 (" +
                     (tensor.defined() && tensor.dim() ? std::to_string(tensor.size(0)) : std::string("none")) +
                     ") must be a multiple of the group's " + std::to_string(n) + " processes");
  torch::Tensor in = tensor.contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] /= n;
  torch::Tensor out = torch::empty(sizes, in.options());
  if (n == 1) return out.copy_(in);
  DLTensor a = sdk::dl_view(in), b = sdk::dl_view(out);
  if (auto work = e.comm->reduce_scatter(a, b, group_op(op), nullptr)) work->wait(0);
  return out;
}

void Engine::group_broadcast_(const std::string& name, torch::Tensor& tensor, int from) {
  const auto& e = group_entry(*impl_->groups, name);
  if (from < 0 || from >= e.group.size())
    throw UsageError(group_label(name, "broadcast_") + ": from " + std::to_string(from) + " is not a rank of the group [0, " +
                     std::to_string(e.group.size()) + ")");
  group_require_contiguous(name, "broadcast_", tensor);
  if (e.group.size() == 1) return;
  DLTensor v = sdk::dl_view(tensor);
  if (auto work = e.comm->broadcast(v, from, nullptr)) work->wait(0);
}

}  // namespace hasten::detail
