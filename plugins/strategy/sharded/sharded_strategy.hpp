// The sharding engine behind the "zero" and "fsdp" strategies (one implementation, two
// option vocabularies). Policy by stage:
//   0  nothing sharded: gradients averaged per unit (FSDP's NO_SHARD, DDP-equivalent)
//   1  optimizer state sharded: gradients averaged in full, each rank steps its shard, the
//      updated shards are all-gathered into the parameters
//   2  + gradients sharded: each unit's gradients are reduce-scattered as soon as backward has
//      produced them, and the full gradients are freed
//   3  + parameters sharded at rest: a unit's parameters are gathered before its forward and
//      again before its backward, and freed after each
// HSDP: with a device mesh of dp_replicate x dp_shard (parallelism_config; fsdp's HYBRID_SHARD
// across machines), everything above runs within the rank's dp_shard group, and each reduced
// gradient shard is then summed across the dp_replicate group: shards stay inside a machine and
// only 1/(shard group size) of the gradients crosses machines.
// Offload keeps the float32 master shards, their gradients and the optimizer state on the CPU.
//
// Mechanics: each unit's parameters become views into one
// flat buffer (set_, not autograd views); their gradients views into a flat gradient buffer;
// freeing returns a buffer's memory at the StorageImpl level and turns its parameters into
// empty tensors (without a version bump), so a unit used outside its wrapper fails with a
// shape error instead of reading freed memory. Gradient-ready events come from post-hooks on
// the parameters' AccumulateGrad nodes; pre-backward gathers from hooks on the unit outputs.
// The optimizer the user made is re-pointed at 1-D views of this rank's shard, param groups
// kept, so any element-wise torch::optim optimizer trains the shards.
#pragma once

#include <hasten/plugin_torch.hpp>
#include <hasten/plugin_optimizer_state.hpp>

#include "buffer_pool.hpp"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace hasten::sharded {

// What the strategy does, from either vocabulary (options.cpp). The defaults of the options
// each vocabulary describes are its descriptor's default_json (library.cpp), read when a key is
// absent; these initial values are only what a vocabulary without the option means.
struct Options {
  int stage = 0;
  bool offload_optimizer = false;  // master shards, their gradients and optimizer state on the CPU
  bool offload_params = false;     // stage 3: parameters live only as CPU shards at rest
  bool reshard_after_forward = true;
  bool backward_prefetch = false;  // gather the next unit while the current one runs backward
  bool forward_prefetch = false;   // gather the next unit while the current one runs forward
  double gradient_clipping = 0;    // > 0: clip the global norm before every step
  std::string label = "zero";      // the plugin's name, for messages
};

// Each vocabulary's options (options.cpp), read against its described options `specs` (the
// descriptor's array, library.cpp): an absent key is its default_json there.
Options parse_zero_options(const hasten_host_api* host, std::string_view json, const hasten_option_spec* specs,
                           size_t n_specs);
Options parse_fsdp_options(const hasten_host_api* host, std::string_view json, const hasten_option_spec* specs,
                           size_t n_specs);

class ShardedStrategy final : public sdk::Strategy {
 public:
  ShardedStrategy(const hasten_host_api* host, Options options);
  ~ShardedStrategy() override;

  void prepare_model(torch::nn::Module& model, const hasten_model_info& info) override;
  void prepare_optimizer(torch::optim::Optimizer& optimizer) override;
  void set_gradient_sync(torch::nn::Module& model, bool enabled) override;
  void before_backward() override;
  void after_backward() override;
  void before_optimizer_step(torch::optim::Optimizer& optimizer) override;
  void after_optimizer_step(torch::optim::Optimizer& optimizer) override;
  double clip_grad_norm(torch::nn::Module& model, double max_norm, double norm_type) override;
  void unit_pre_forward(torch::nn::Module& model, uint32_t unit) override;
  void unit_post_forward(torch::nn::Module& model, uint32_t unit, at::Tensor* const* outputs,
                         uint32_t n_outputs) override;
  void memory_report(hasten_memory_report& out) override;
  void state_dict(torch::nn::Module& model, int32_t kind, const Emit& emit) override;
  void load_state_dict(torch::nn::Module& model, const NamedTensorRefs& tensors) override;
  void load_state_dict_ranges(torch::nn::Module& model, const ReadRange& read) override;
  void optimizer_state(torch::optim::Optimizer& optimizer, torch::nn::Module& model, const Emit& emit) override;
  void load_optimizer_state(torch::optim::Optimizer& optimizer, torch::nn::Module& model,
                            const NamedTensorRefs& tensors) override;
  void unit_built(torch::nn::Module& unit, const hasten_model_info& info) override;

 private:
  struct Unit {
    torch::nn::Module* module = nullptr;
    std::vector<torch::Tensor> params;  // owned by this unit, require grad
    std::vector<std::string> names;     // their names in the model
    std::vector<int64_t> offsets;
    std::vector<std::vector<int64_t>> shapes;  // kept: freed parameters are empty tensors
    int64_t numel = 0, padded = 0, shard = 0;
    torch::Tensor flat;        // full parameters (compute device); memory freed at rest in stage 3
    torch::Tensor flat_grad;   // full gradients; freed between reductions in stages 2 and 3
    torch::Tensor master;      // this rank's shard of the parameters (float32 master)
    torch::Tensor shard_grad;  // its gradients (a view of flat_grad in stage 1)
    torch::Tensor reduced;     // reduce-scatter output, only while a reduction is in flight
    torch::Tensor staging;     // allgather input, only while a gather is in flight
    bool params_live = true, grads_live = true;
    bool gathering = false;    // an allgather into flat was issued and not yet finished
    // The comm backend finished this unit's last allgather inside the call (it returned no
    // work: shm runs collectives on the caller's thread). A prefetch of the unit would then
    // overlap nothing and only hold its parameters longer, so backward does not prefetch it.
    bool gathers_in_call = false;
    int users = 0;             // forwards under way
    int pending = 0;           // gradients not yet produced in this backward
    bool ready = false;
    hasten_work* reduce_work = nullptr;
    hasten_work* gather_work = nullptr;
    bool keep_after_forward = false;
    std::vector<sdk::GradReadyHook> hooks;
    // At rest (stages 2 and 3, full gradients freed) each parameter's .grad is a placeholder:
    // an empty sparse tensor of its shape, version recorded here. The user's Module::zero_grad()
    // zeroes it (a version bump) or resets it: either clears the parameter's part of shard_grad.
    std::vector<int64_t> placeholder_version;
  };

  struct Model {
    torch::nn::Module* module = nullptr;
    std::vector<Unit> units;
    std::vector<uint32_t> forward_order;  // units in the order of their first forward this pass
    std::vector<uint32_t> plan;           // expected backward order: the last forward reversed
    size_t next = 0;                      // next unit of `plan` to reduce
    bool sync = true;
    bool touched = false;
    std::vector<torch::Tensor> frozen;    // parameters that need no gradient: never sharded
    std::mutex mutex;
  };

  // Where a parameter lives, for re-pointing optimizers.
  struct Location {
    Model* model;
    uint32_t unit;
    size_t index;
  };

  // Units built sharded (sharded_build.cpp): what unit_built kept of a unit, until
  // prepare_model finds the unit in a model and adopts it (materialize_unit).
  struct Built {
    std::vector<torch::Tensor> params;         // the unit's own parameters, now 0-element
    std::vector<std::vector<int64_t>> shapes;  // their full shapes
    torch::Tensor master;                      // this rank's shard, as materialize_unit keeps it
  };
  bool built(const torch::Tensor& param) const { return built_params_.count(param.unsafeGetTensorImpl()) != 0; }
  std::vector<int64_t> full_shape(const torch::Tensor& param) const;
  // This rank's float32 master shard of a unit whose parameters are live in u.flat.
  torch::Tensor make_master(const Unit& u) const;
  // prepare_model's side: u's parameters were built sharded; gathers them once so the
  // gradient hooks see their shapes (one unit's memory, freed again by materialize_unit).
  bool adopt_built(Unit& u, const std::string& model_label);

  Model& find(torch::nn::Module& module);
  void build_units(Model& m, const hasten_model_info& info);
  void materialize_unit(Model& m, uint32_t unit);
  void broadcast_from_rank0(torch::nn::Module& module);

  // Memory of a unit's flat buffers.
  void storage_free(const torch::Tensor& flat);
  void storage_alloc(const torch::Tensor& flat, size_t nbytes);
  torch::Tensor pooled_empty(int64_t n, const torch::TensorOptions& options);
  void free_params(Unit& u);
  static void return_freed_memory();  // the user's storage a unit replaced, back to the system
  void begin_gather(Unit& u);
  void prefetch_neighbour(Model& m, uint32_t unit, int step);
  void finish_gather(Unit& u);
  void gather_now(Unit& u);
  void begin_gather_into_live(Unit& u);
  void alloc_grads(Unit& u);
  void free_grads(Unit& u);
  void attach_grads(Unit& u);
  void attach_grad(Unit& u, size_t param);
  void place_placeholders(Unit& u);
  void take_user_zero_grad(Unit& u, bool strip);
  void take_user_zero_grad(bool strip);
  void check_params(const Model& m, const Unit& u) const;

  void grad_ready(Model& m, uint32_t unit, size_t param);
  void launch_ready(Model& m);
  void launch(Unit& u);
  void finish_reduction(Unit& u);
  void finish_completed_reductions(Model& m);
  void pre_backward(Model& m, uint32_t unit);

  void collective(hasten_status st, const char* what);
  void wait(hasten_work*& work, const char* what);
  torch::Device shard_device() const;
  void count_peaks();

  // Options with the shard group (hasten_coll_options.group; NULL: every rank): what the
  // parameter all-gathers and gradient reduce-scatters run over.
  hasten_coll_options shard_options() const { return sdk::group_options(shard_group_); }

  Options options_;
  // rank_ and world_ are the shard group's: every rank's, or under HSDP (a device mesh of
  // dp_replicate x dp_shard, stages 1-3) the dp_shard group's. replica_ of replicas_ is the
  // rank's place along dp_replicate (0 of 1 without HSDP): replicas hold the same shards.
  int rank_ = 0, world_ = 1;
  int replica_ = 0, replicas_ = 1;
  const hasten_group* shard_group_ = nullptr;      // NULL: every rank
  const hasten_group* replicate_group_ = nullptr;  // HSDP only
  torch::Device device_{torch::kCPU};
  std::atomic<bool> in_backward_{false};
  std::vector<std::unique_ptr<Model>> models_;
  std::map<const void*, Location> locations_;  // TensorImpl* of an original parameter
  std::vector<torch::optim::Optimizer*> optimizers_;
  std::vector<torch::Tensor> views_;  // the optimizer's shard views (keep their TensorImpls alive)
  // (optimizer, model, unit, parameter index) -> the view the optimizer steps (stages >= 1).
  std::map<std::tuple<const torch::optim::Optimizer*, const Model*, uint32_t, size_t>, torch::Tensor> view_of_;
  hasten_memory_report peak_{};
  BufferPool pool_;  // freed unit buffers, reused by the next gather or backward (CPU)
  std::vector<std::unique_ptr<Built>> built_;  // units built sharded, not yet prepared
  std::map<const void*, std::pair<Built*, size_t>> built_params_;  // TensorImpl* -> (unit, index)
  bool warned_whole_build_ = false;  // sharded_init below stage 3 said once that it keeps units whole
};

}  // namespace hasten::sharded
