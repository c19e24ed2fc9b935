// Strategy "ddp": data parallel training, gradients averaged across every rank.
//
// At prepare, rank 0's parameters (and buffers) are broadcast, and each parameter's gradient
// is made a view into a flat bucket buffer (buckets of bucket_cap_mb, the first of 1 MB, in
// reverse registration order, which is roughly the order backward produces them). During
// backward a post-hook on each parameter's AccumulateGrad node counts down its bucket; a
// bucket whose gradients are all in is averaged with an asynchronous allreduce while backward
// goes on. Buckets are launched in index order on every rank (a ready bucket waits for its
// predecessors), so every rank issues the same collectives in the same order whatever order
// autograd finishes in. after_backward launches what is left (buckets with parameters this
// backward did not use) and waits for everything. No tensor is allocated per step.
#include <hasten/plugin_torch.hpp>
#include <hasten/torch_compat.hpp>

#include <atomic>
#include <map>
#include <mutex>

namespace {

using hasten::sdk::Error;

using hasten::sdk::OptionSpec;

// PyTorch DDP's options (Accelerate's DistributedDataParallelKwargs).
constexpr hasten_option_spec kDdpOptions[] = {
    OptionSpec("bucket_cap_mb", HASTEN_OPTION_FLOAT, "Gradient bucket size in MiB (> 0)").default_json("25"),
    OptionSpec("first_bucket_cap_mb", HASTEN_OPTION_FLOAT, "Size of the first bucket in MiB (> 0)").default_json("1"),
    OptionSpec("find_unused_parameters", HASTEN_OPTION_BOOL, "Parameters may get no gradient in a step")
        .default_json("false"),
    OptionSpec("broadcast_buffers", HASTEN_OPTION_BOOL, "Broadcast rank 0's buffers before each forward")
        .default_json("true"),
    OptionSpec("gradient_as_bucket_view", HASTEN_OPTION_BOOL, "Accepted; gradients always are views of the buckets"),
    OptionSpec("static_graph", HASTEN_OPTION_BOOL, "Only false (true is refused: no static-graph mode)")
        .default_json("false"),
    OptionSpec("check_reduction", HASTEN_OPTION_BOOL, "Only false (deprecated in PyTorch, which ignores it)")
        .default_json("false"),
    OptionSpec("dim", HASTEN_OPTION_INT, "Batch dimension; only 0").default_json("0"),
    OptionSpec("comm_hook", HASTEN_OPTION_ENUM, "Gradient compression hook; only no").allowed("no"),
    OptionSpec("comm_wrapper", HASTEN_OPTION_ENUM, "Gradient compression wrapper; only no").allowed("no"),
};

// The options' values; their defaults are kDdpOptions' default_json, read by parse_options.
struct Options {
  double bucket_cap_mb = 0;
  double first_bucket_cap_mb = 0;
  bool find_unused_parameters = false;
  bool broadcast_buffers = false;
};

// The host has checked every key and type against kDdpOptions; what is left here is what
// involves meaning. An absent key reads as its described default.
Options parse_options(const hasten_host_api* host, std::string_view text) {
  const hasten::sdk::Options in(host, text, kDdpOptions);
  Options o;
  auto positive = [&](const char* key, double& out) {
    const double v = in.number(key).value();
    if (v <= 0)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, std::string("ddp options: ") + key + ": expected a positive number, got " +
                                                   std::to_string(v));
    out = v;
  };
  positive("bucket_cap_mb", o.bucket_cap_mb);
  positive("first_bucket_cap_mb", o.first_bucket_cap_mb);
  o.find_unused_parameters = in.boolean("find_unused_parameters").value();
  o.broadcast_buffers = in.boolean("broadcast_buffers").value();
  // PyTorch's static_graph=True lets DDP support reentrant backwards and parameters used
  // several times per backward; hasten's ddp has not that mode, so true is refused rather than
  // accepted and ignored. check_reduction is deprecated in PyTorch, which ignores it.
  if (in.boolean("static_graph").value_or(false))
    throw Error(HASTEN_ERR_UNSUPPORTED,
                "ddp options: static_graph: true is not supported (hasten's ddp has no static-graph mode; allowed: "
                "false)");
  if (in.boolean("check_reduction").value_or(false))
    throw Error(HASTEN_ERR_UNSUPPORTED,
                "ddp options: check_reduction: true is not supported (PyTorch deprecated it and ignores it; allowed: "
                "false)");
  if (auto dim = in.integer("dim"); dim && *dim != 0)
    throw Error(HASTEN_ERR_UNSUPPORTED, "ddp options: dim: only 0 is supported, got " + std::to_string(*dim));
  return o;
}

// A tensor that shares `flat`'s storage at `offset` with `shape`: built with set_, not as an
// autograd view, so optimizers can detach_() and zero it in place.
torch::Tensor alias(const torch::Tensor& flat, int64_t offset, at::IntArrayRef shape) {
  torch::NoGradGuard no_grad;
  auto t = torch::empty({0}, flat.options());
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    strides[static_cast<size_t>(i)] = strides[static_cast<size_t>(i + 1)] * shape[static_cast<size_t>(i + 1)];
  t.set_(flat.storage(), flat.storage_offset() + offset, shape, strides);
  return t;
}

struct Bucket {
  torch::Tensor flat;
  std::vector<size_t> params;
  std::vector<int64_t> offsets;
  int64_t shape[1] = {0};
  DLTensor view{};
  int pending = 0;
  bool ready = false;
  hasten_work* work = nullptr;
};


struct Model {
  torch::nn::Module* module = nullptr;
  std::vector<torch::Tensor> params;   // those that require grad
  std::vector<size_t> bucket_of;
  std::vector<Bucket> buckets;
  std::vector<hasten::sdk::GradReadyHook> hooks;
  bool sync = true;
  bool touched = false;  // some gradient arrived during this backward
  size_t next = 0;       // the next bucket to launch
  std::mutex mutex;
};

class DdpStrategy final : public hasten::sdk::Strategy {
 public:
  DdpStrategy(const hasten_host_api* host, std::string_view options)
      : Strategy(host), options_(parse_options(host, options)), world_(hasten::sdk::process_info(host).world_size) {
    // Under tensor parallelism (a device mesh with tp > 1) the replicas of a parameter are the
    // ranks of its `dp` group: gradients are averaged, and rank 0's weights broadcast, over it.
    if (const auto dp = hasten::sdk::mesh_group(host, "dp"); dp && dp->size < world_) {
      group_ = dp->handle;
      world_ = dp->size;
    }
  }

  ~DdpStrategy() override {
    for (auto& m : models_)
      m->hooks.clear();  // removes the post-hooks
    for (auto& m : models_)
      for (auto& b : m->buckets) release(b);
  }

  void prepare_model(torch::nn::Module& module, const hasten_model_info& info) override {
    module.to(hasten::sdk::torch_device(info.device));
    auto model = std::make_unique<Model>();
    model->module = &module;
    for (auto& p : module.parameters())
      if (p.requires_grad()) model->params.push_back(p);
    broadcast_state(module, options_.broadcast_buffers);
    build_buckets(*model);
    const size_t index = models_.size();
    for (size_t i = 0; i < model->params.size(); ++i) {
      model->hooks.emplace_back(model->params[i], [this, index, i] { grad_ready(index, i); }, "ddp");
    }
    models_.push_back(std::move(model));
  }

  void set_gradient_sync(torch::nn::Module& module, bool enabled) override { find(module).sync = enabled; }

  void before_backward() override {
    for (auto& m : models_) {
      attach_gradients(*m);
      std::lock_guard<std::mutex> lock(m->mutex);
      m->touched = false;
      m->next = 0;
      for (auto& b : m->buckets) {
        b.pending = static_cast<int>(b.params.size());
        b.ready = false;
      }
    }
    in_backward_.store(true);
  }

  void after_backward() override {
    in_backward_.store(false);
    for (auto& m : models_) {
      if (!m->sync || !m->touched) continue;
      {
        // Buckets whose parameters this backward did not use: launch them now, in order.
        std::lock_guard<std::mutex> lock(m->mutex);
        for (auto& b : m->buckets) b.ready = true;
        launch_ready(*m);
      }
      for (auto& b : m->buckets) finish(b);
    }
  }

  void after_optimizer_step(torch::optim::Optimizer&) override {
    if (!options_.broadcast_buffers || world_ == 1) return;
    for (auto& m : models_)
      if (!m->module->buffers().empty()) broadcast_tensors(m->module->buffers());
  }

 private:
  Model& find(torch::nn::Module& module) {
    for (auto& m : models_)
      if (m->module == &module) return *m;
    throw Error(HASTEN_ERR_INVALID_USAGE, "ddp: this model was not prepared");
  }

  // Every rank starts from rank 0's weights.
  void broadcast_state(torch::nn::Module& module, bool buffers) {
    if (world_ == 1) return;
    broadcast_tensors(module.parameters());
    if (buffers && !module.buffers().empty()) broadcast_tensors(module.buffers());
  }

  void broadcast_tensors(const std::vector<torch::Tensor>& tensors) {
    hasten::sdk::broadcast_from_rank0(host(), tensors, group_);
  }

  void build_buckets(Model& m) {
    m.bucket_of.assign(m.params.size(), 0);
    // Reverse registration order; one dtype and device per bucket.
    std::vector<size_t> order(m.params.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
    const double mb = 1024.0 * 1024.0;
    std::vector<Bucket> buckets;
    int64_t bytes = 0;
    auto cap = [&] { return static_cast<int64_t>((buckets.size() <= 1 ? options_.first_bucket_cap_mb : options_.bucket_cap_mb) * mb); };
    for (size_t i : order) {
      const auto& p = m.params[i];
      const bool fits = !buckets.empty() &&
                        m.params[buckets.back().params.front()].scalar_type() == p.scalar_type() &&
                        m.params[buckets.back().params.front()].device() == p.device() &&
                        bytes + static_cast<int64_t>(p.numel() * p.element_size()) <= cap();
      if (!fits) {
        buckets.emplace_back();
        bytes = 0;
      }
      buckets.back().params.push_back(i);
      bytes += static_cast<int64_t>(p.numel() * p.element_size());
    }
    for (size_t b = 0; b < buckets.size(); ++b) {
      Bucket& bucket = buckets[b];
      int64_t numel = 0;
      for (size_t i : bucket.params) {
        bucket.offsets.push_back(numel);
        numel += m.params[i].numel();
        m.bucket_of[i] = b;
      }
      const auto& first = m.params[bucket.params.front()];
      bucket.flat = torch::zeros({numel}, first.options().requires_grad(false));
      bucket.shape[0] = numel;
      bucket.view = hasten::sdk::dl_view(bucket.flat);
      bucket.view.shape = bucket.shape;
    }
    m.buckets = std::move(buckets);
    attach_gradients(m);
  }

  // Points every parameter's .grad into its bucket (again, if something replaced it: a
  // zero_grad that set it to None, a user assignment), keeping its current values.
  void attach_gradients(Model& m) {
    for (size_t b = 0; b < m.buckets.size(); ++b) {
      Bucket& bucket = m.buckets[b];
      for (size_t k = 0; k < bucket.params.size(); ++k) {
        auto& p = m.params[bucket.params[k]];
        char* expected = static_cast<char*>(bucket.flat.data_ptr()) + bucket.offsets[k] * bucket.flat.element_size();
        const auto& g = p.grad();
        if (g.defined() && g.data_ptr() == expected && g.sizes() == p.sizes()) continue;
        torch::Tensor view = alias(bucket.flat, bucket.offsets[k], p.sizes());
        torch::NoGradGuard no_grad;
        if (g.defined())
          view.copy_(g);
        else
          view.zero_();
        p.mutable_grad() = view;
      }
    }
  }

  // Called on an autograd thread once a parameter's gradient is accumulated.
  void grad_ready(size_t model, size_t param) {
    if (!in_backward_.load()) return;  // a backward not run through Accelerator::backward
    Model& m = *models_[model];
    if (!m.sync) return;
    std::lock_guard<std::mutex> lock(m.mutex);
    m.touched = true;
    Bucket& b = m.buckets[m.bucket_of[param]];
    if (--b.pending == 0) {
      b.ready = true;
      launch_ready(m);
    }
  }

  // Launches ready buckets in index order (caller holds m.mutex).
  void launch_ready(Model& m) {
    while (m.next < m.buckets.size() && m.buckets[m.next].ready) {
      Bucket& b = m.buckets[m.next++];
      if (world_ == 1) continue;
      b.flat.div_(world_);  // average as PyTorch DDP does: divide, then sum
      const hasten_coll_options over = hasten::sdk::group_options(group_);
      run(host()->allreduce(host(), &b.view, HASTEN_REDUCE_SUM, group_ != nullptr ? &over : nullptr, &b.work),
          "gradient allreduce");
    }
  }

  void finish(Bucket& b) { hasten::sdk::wait_and_free(host(), b.work, "ddp: gradient allreduce"); }

  void release(Bucket& b) noexcept {
    if (b.work != nullptr) host()->work_free(host(), b.work);
    b.work = nullptr;
  }

  void run(hasten_status st, const char* what) { hasten::sdk::check(host(), st, what); }

  Options options_;
  int world_;                              // the replicas of a parameter: every rank, or the dp group's
  const hasten_group* group_ = nullptr;    // the dp group under tensor parallelism; NULL: every rank
  std::atomic<bool> in_backward_{false};
  std::vector<std::unique_ptr<Model>> models_;
};


constexpr hasten_plugin_descriptor kDdp = hasten::sdk::answering(
    hasten::sdk::with_options(
        hasten::sdk::strategy_descriptor<DdpStrategy>(
            "ddp", "1.0", "data parallel: bucketed gradient allreduce overlapped with backward"),
        kDdpOptions),
    "MULTI_CPU,MULTI_GPU");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kDdp)
