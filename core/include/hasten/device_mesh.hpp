// Accelerator::device_mesh(): the run's processes as a mesh of named dimensions (config key
// parallelism_config, Accelerate's ParallelismConfig), and this process's group along each, on
// which collectives run over that group's members only (PyTorch's DeviceMesh and its process
// groups).
//
// The dimensions, outermost first: dp_replicate, dp_shard, cp, tp; a process's coordinates are
// the digits of its rank in that mixed radix, tp the fastest, so a tp group is adjacent ranks
// and a dp_replicate group spans machines. "dp" is dp_replicate x dp_shard: the processes that
// read different data. Without parallelism_config the mesh is dp_replicate over every process.
//
//   // parallelism_config: {parallelism_config_dp_shard_size: 2, parallelism_config_tp_size: 2}
//   auto mesh = acc.device_mesh();
//   auto tp = mesh.group("tp");            // this process and its tensor-parallel partner
//   tp.all_reduce_(partial_sums);          // over those two only
#pragma once

#include <hasten/detail/engine.hpp>

#include <torch/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hasten {

// One group of the mesh as this process sees it. Every member must call each collective, in
// the same order (as with the Accelerator's own); other processes do not take part. It does not
// keep the Accelerator alive (layers of a prepared model hold groups, and the Accelerator holds
// the model): a collective after the Accelerator is gone is a UsageError.
class ProcessGroup {
 public:
  ProcessGroup(const std::shared_ptr<detail::Engine>& engine, std::string name)
      : engine_(engine), name_(std::move(name)), view_(engine->mesh_group(name_)) {}

  const std::string& name() const { return name_; }
  // This process's rank in the group, 0..size()-1 (its place in ranks()).
  int rank() const { return view_.rank; }
  int size() const { return view_.size(); }
  // The members' ranks in the run, ascending: the group's rank order.
  const std::vector<int>& ranks() const { return view_.ranks; }

  // In place: the members' tensors reduced (Avg divides by size()).
  void all_reduce_(torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum) const {
    engine()->group_all_reduce_(name_, tensor, op);
  }
  // The members' tensors concatenated along dim 0 in rank order (a scalar counts as [1]).
  torch::Tensor all_gather(const torch::Tensor& tensor) const { return engine()->group_all_gather(name_, tensor); }
  // This member's part of the reduction: dim 0 (a multiple of size()) split in size() parts.
  torch::Tensor reduce_scatter(const torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum) const {
    return engine()->group_reduce_scatter(name_, tensor, op);
  }
  // In place: the tensor of the member whose group rank is `from`.
  void broadcast_(torch::Tensor& tensor, int from) const { engine()->group_broadcast_(name_, tensor, from); }

 private:
  std::shared_ptr<detail::Engine> engine() const {
    auto e = engine_.lock();
    if (!e) throw UsageError("process group '" + name_ + "': the Accelerator that made it is gone");
    return e;
  }
  std::weak_ptr<detail::Engine> engine_;
  std::string name_;
  detail::MeshGroupView view_;
};

class DeviceMesh {
 public:
  explicit DeviceMesh(std::shared_ptr<detail::Engine> engine) : engine_(std::move(engine)) {}
  // The four dimensions and their sizes, outermost first (sizes of 1 included).
  std::vector<std::pair<std::string, int>> dims() const { return engine_->mesh_dims(); }
  // A dimension's size, or "dp"'s; UsageError naming the allowed names for another.
  int size(const std::string& name) const { return group(name).size(); }
  // This process's coordinate along a dimension (its rank in that group).
  int coordinate(const std::string& name) const { return group(name).rank(); }
  // This process's group along a dimension, or "dp".
  ProcessGroup group(const std::string& name) const { return ProcessGroup(engine_, name); }

 private:
  std::shared_ptr<detail::Engine> engine_;
};

}  // namespace hasten
