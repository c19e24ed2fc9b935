// C++ helpers for torch-tier plugins (strategies, precisions): everything of <hasten/plugin.hpp>
// plus the LibTorch fingerprint baked into their descriptors, conversions between the ABI's
// handles and LibTorch objects, DLPack views, and the Strategy and Precision base classes.
// hasten_add_plugin(... TORCH) links LibTorch for them. Header-only; nothing here is ABI.
#ifndef HASTEN_PLUGIN_TORCH_HPP
#define HASTEN_PLUGIN_TORCH_HPP

#include <hasten/plugin.hpp>

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <hasten/torch_compat.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hasten::sdk {
inline namespace v1 {

#define HASTEN_SDK_STR2(x) #x
#define HASTEN_SDK_STR(x) HASTEN_SDK_STR2(x)
#if __has_include(<ATen/cuda/CUDAConfig.h>)
#define HASTEN_SDK_TORCH_DEVICE "cuda"
#else
#define HASTEN_SDK_TORCH_DEVICE "cpu"
#endif
#if defined(_LIBCPP_VERSION)
#define HASTEN_SDK_STDLIB "libc++"
#else
#define HASTEN_SDK_STDLIB "libstdc++"
#endif
// The LibTorch build this translation unit is compiled against. Two sides with equal
// fingerprints can pass at::Tensor / torch::nn::Module objects to each other.
#define HASTEN_TORCH_FINGERPRINT                                                   \
  "torch=" TORCH_VERSION ";cxx11abi=" HASTEN_SDK_STR(_GLIBCXX_USE_CXX11_ABI) ";device=" \
      HASTEN_SDK_TORCH_DEVICE ";stdlib=" HASTEN_SDK_STDLIB

// Handles are borrowed LibTorch objects owned by the host.
inline at::Tensor& tensor(hasten_tensor* h) { return *reinterpret_cast<at::Tensor*>(h); }
inline torch::nn::Module& module(hasten_module* h) {
  return *reinterpret_cast<torch::nn::Module*>(h);
}
inline torch::optim::Optimizer& optimizer(hasten_optimizer* h) {
  return *reinterpret_cast<torch::optim::Optimizer*>(h);
}
inline hasten_tensor* handle(at::Tensor& t) { return reinterpret_cast<hasten_tensor*>(&t); }
inline hasten_module* handle(torch::nn::Module& m) {
  return reinterpret_cast<hasten_module*>(&m);
}
inline hasten_optimizer* handle(torch::optim::Optimizer& o) {
  return reinterpret_cast<hasten_optimizer*>(&o);
}

inline DLDataType dl_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return {kDLFloat, 32, 1};
    case at::kDouble: return {kDLFloat, 64, 1};
    case at::kHalf: return {kDLFloat, 16, 1};
    case at::kBFloat16: return {kDLBfloat, 16, 1};
    case at::kLong: return {kDLInt, 64, 1};
    case at::kInt: return {kDLInt, 32, 1};
    case at::kByte: return {kDLUInt, 8, 1};
    case at::kChar: return {kDLInt, 8, 1};
    case at::kBool: return {kDLUInt, 8, 1};
    default: throw Error(HASTEN_ERR_UNSUPPORTED, std::string("unsupported dtype ") +
                                                     c10::toString(type));
  }
}

inline DLDevice dl_device(const at::Device& device) {
  DLDevice d{};
  d.device_type = device.is_cuda() ? kDLCUDA : kDLCPU;
  d.device_id = device.has_index() ? device.index() : 0;
  return d;
}

// A non-owning DLTensor view of a contiguous tensor, valid while t lives and keeps its shape.
inline DLTensor dl_view(const at::Tensor& t) {
  if (!t.is_contiguous())
    throw Error(HASTEN_ERR_INVALID_ARGUMENT, "collective buffers must be contiguous");
  DLTensor v{};
  v.data = t.data_ptr();
  v.device = dl_device(t.device());
  v.ndim = static_cast<int32_t>(t.dim());
  v.dtype = dl_dtype(t.scalar_type());
  v.shape = const_cast<int64_t*>(t.sizes().data());
  v.strides = nullptr;  // compact row-major
  v.byte_offset = 0;
  return v;
}

// Waits for a host work item and frees it; a failure throws Error naming `what` with the
// host's message. work is set to NULL first, so a throw never leaves it to be freed twice.
// A NULL work (the operation completed synchronously) returns at once.
inline void wait_and_free(const hasten_host_api* host, hasten_work*& work, const std::string& what) {
  if (work == nullptr) return;
  hasten_work* w = work;
  work = nullptr;
  const hasten_status st = host->work_wait(host, w, 0);
  const std::string message = st != HASTEN_OK && host->last_error != nullptr ? host->last_error(host) : "";
  host->work_free(host, w);
  if (st != HASTEN_OK) throw Error(st, what + " failed: " + message);
}

// Calls `ready` each time autograd has accumulated a gradient into a parameter (a post-hook on
// its AccumulateGrad node: the moment a strategy may start reducing it), until destroyed.
// Throws Error for a parameter that is not a leaf. Move-only.
class GradReadyHook {
 public:
  GradReadyHook(const at::Tensor& param, std::function<void()> ready, const std::string& who) {
    node_ = torch::autograd::impl::grad_accumulator(param);
    if (!node_) throw Error(HASTEN_ERR_INVALID_ARGUMENT, who + ": a parameter that requires grad is not a leaf");
    key_ = node_->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [ready = std::move(ready)](const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>&) {
          ready();
          return outputs;
        }));
  }
  GradReadyHook(GradReadyHook&& other) noexcept : node_(std::move(other.node_)), key_(other.key_) { other.node_ = nullptr; }
  GradReadyHook& operator=(GradReadyHook&&) = delete;
  GradReadyHook(const GradReadyHook&) = delete;
  GradReadyHook& operator=(const GradReadyHook&) = delete;
  ~GradReadyHook() {
    if (node_) node_->del_post_hook(key_);
  }

 private:
  compat::NodePtr node_;  // kept alive: parameters hold it weakly
  uintptr_t key_ = 0;
};

// The LibTorch device a hasten_model_info (or any DLDevice) names: CPU or CUDA.
inline torch::Device torch_device(const DLDevice& d) {
  return d.device_type == kDLCUDA ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(d.device_id))
                                  : torch::Device(torch::kCPU);
}

// Gives every rank rank 0's values of `tensors`, in place: host broadcasts per (dtype,
// device), of buckets of at most 16 MiB (a larger tensor alone and in place), in an order
// that is the same on every rank, so a model's broadcast holds no second copy of the model.
// Strategies call it at prepare so that all ranks start from the same weights. Collective.
// group (ABI 1.11): over that group's ranks only, from its rank 0 (ddp under tensor
// parallelism: each tensor-parallel rank's own replicas); NULL: every rank, from rank 0.
inline void broadcast_from_rank0(const hasten_host_api* host, const std::vector<at::Tensor>& tensors,
                                 const hasten_group* group = nullptr) {
  const hasten_coll_options options = group_options(group);
  const hasten_coll_options* o = group != nullptr ? &options : nullptr;
  constexpr size_t kBucketBytes = size_t{16} << 20;
  at::NoGradGuard no_grad;
  std::map<std::string, std::vector<at::Tensor>> groups;
  for (auto& t : tensors)
    if (t.numel() > 0) groups[std::string(c10::toString(t.scalar_type())) + "@" + t.device().str()].push_back(t);
  for (auto& [key, group] : groups) {
    std::vector<at::Tensor> bucket;
    size_t bytes = 0;
    const auto flush = [&] {
      if (bucket.size() == 1 && bucket.front().is_contiguous()) {
        DLTensor v = dl_view(bucket.front());
        check(host, host->broadcast(host, &v, 0, o, nullptr), "broadcast of rank 0's weights");
      } else if (!bucket.empty()) {
        std::vector<at::Tensor> parts;
        for (auto& t : bucket) parts.push_back(t.reshape(-1));
        at::Tensor flat = at::cat(parts);
        DLTensor v = dl_view(flat);
        check(host, host->broadcast(host, &v, 0, o, nullptr), "broadcast of rank 0's weights");
        int64_t offset = 0;
        for (auto& t : bucket) {
          at::Tensor piece = flat.narrow(0, offset, t.numel()).view_as(t);
          t.copy_(piece);  // in-place ops are const on the handle: the storage is shared
          offset += t.numel();
        }
      }
      bucket.clear();
      bytes = 0;
    };
    for (auto& t : group) {
      const size_t n = t.numel() * t.element_size();
      if (!bucket.empty() && bytes + n > kBucketBytes) flush();
      bucket.push_back(t);
      bytes += n;
    }
    flush();
  }
}


class Strategy : public PluginBase {
 public:
  using PluginBase::PluginBase;
  virtual void prepare_model(torch::nn::Module& model, const hasten_model_info& info) = 0;
  virtual void prepare_optimizer(torch::optim::Optimizer& optimizer) { (void)optimizer; }
  virtual void set_gradient_sync(torch::nn::Module& model, bool enabled) {
    (void)model, (void)enabled;
  }
  virtual void before_backward() {}
  virtual void after_backward() {}
  virtual void before_optimizer_step(torch::optim::Optimizer& optimizer) { (void)optimizer; }
  virtual void after_optimizer_step(torch::optim::Optimizer& optimizer) { (void)optimizer; }
  virtual double clip_grad_norm(torch::nn::Module& model, double max_norm, double norm_type) {
    (void)model, (void)max_norm, (void)norm_type;
    throw Error(HASTEN_ERR_UNSUPPORTED, "clip_grad_norm");
  }
  virtual void unit_pre_forward(torch::nn::Module& model, uint32_t unit) { (void)model, (void)unit; }
  virtual void unit_post_forward(torch::nn::Module& model, uint32_t unit, at::Tensor* const* outputs,
                                 uint32_t n_outputs) {
    (void)model, (void)unit, (void)outputs, (void)n_outputs;
  }
  virtual void memory_report(hasten_memory_report& out) { (void)out; }
  using Emit = std::function<void(const std::string& name, at::Tensor& value)>;
  virtual void state_dict(torch::nn::Module& model, int32_t kind, const Emit& emit) {
    (void)model, (void)kind, (void)emit;
  }
  // Full tensors by name (every rank the same), to load into what the strategy holds.
  using NamedTensorRefs = std::vector<std::pair<std::string, const at::Tensor*>>;
  virtual void load_state_dict(torch::nn::Module& model, const NamedTensorRefs& tensors) {
    (void)model, (void)tensors;
  }
  // This rank's optimizer state of model's parameters, named as plugin.h's
  // optimizer_state slot says; and the full state to load (names without pieces).
  virtual void optimizer_state(torch::optim::Optimizer& optimizer, torch::nn::Module& model, const Emit& emit) {
    (void)optimizer, (void)model, (void)emit;
  }
  virtual void load_optimizer_state(torch::optim::Optimizer& optimizer, torch::nn::Module& model,
                                    const NamedTensorRefs& tensors) {
    (void)optimizer, (void)model, (void)tensors;
  }
  // ABI 1.5 load_state_dict_ranges: read(name, shape, offset, dst) fills dst with elements
  // [offset, offset + dst.numel()) of the flattened tensor `name` (full shape `shape`); it
  // throws Error with the host's status when the host cannot (missing name, other shape,
  // damaged file).
  using ReadRange =
      std::function<void(const std::string& name, at::IntArrayRef shape, int64_t offset, at::Tensor& dst)>;
  virtual void load_state_dict_ranges(torch::nn::Module& model, const ReadRange& read) { (void)model, (void)read; }
  // ABI 1.8 unit_built: `unit` was just constructed inside a sharded build (plugin.h); keep
  // what this rank holds at rest of the parameters it owns and leave them 0-element tensors
  // until prepare_model adopts them.
  virtual void unit_built(torch::nn::Module& unit, const hasten_model_info& info) { (void)unit, (void)info; }
};

template <class T>
constexpr hasten_strategy_vtable make_strategy_vtable() {
  static_assert(std::is_base_of_v<Strategy, T>, "T must derive from hasten::sdk::Strategy");
  hasten_strategy_vtable vt{};
  vt.struct_size = sizeof(vt);
  vt.abi_version = HASTEN_ABI_VERSION;
  vt.create = &detail::create<T, Strategy>;
  vt.destroy = &detail::destroy<Strategy>;
  vt.prepare_model = [](hasten_instance* i, hasten_module* m,
                        const hasten_model_info* info) noexcept {
    return detail::call<Strategy>(i, [&](Strategy& s) { s.prepare_model(module(m), *info); });
  };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, prepare_optimizer))
    vt.prepare_optimizer = [](hasten_instance* i, hasten_optimizer* o) noexcept {
      return detail::call<Strategy>(i, [&](Strategy& s) { s.prepare_optimizer(optimizer(o)); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, set_gradient_sync))
    vt.set_gradient_sync = [](hasten_instance* i, hasten_module* m, int32_t on) noexcept {
      return detail::call<Strategy>(i,
                                    [&](Strategy& s) { s.set_gradient_sync(module(m), on != 0); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, before_backward))
    vt.before_backward = [](hasten_instance* i) noexcept {
      return detail::call<Strategy>(i, [&](Strategy& s) { s.before_backward(); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, after_backward))
    vt.after_backward = [](hasten_instance* i) noexcept {
      return detail::call<Strategy>(i, [&](Strategy& s) { s.after_backward(); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, before_optimizer_step))
    vt.before_optimizer_step = [](hasten_instance* i, hasten_optimizer* o) noexcept {
      return detail::call<Strategy>(i,
                                    [&](Strategy& s) { s.before_optimizer_step(optimizer(o)); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, after_optimizer_step))
    vt.after_optimizer_step = [](hasten_instance* i, hasten_optimizer* o) noexcept {
      return detail::call<Strategy>(i,
                                    [&](Strategy& s) { s.after_optimizer_step(optimizer(o)); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, clip_grad_norm))
    vt.clip_grad_norm = [](hasten_instance* i, hasten_module* m, double max_norm,
                           double norm_type, double* total) noexcept {
      return detail::call<Strategy>(
          i, [&](Strategy& s) { *total = s.clip_grad_norm(module(m), max_norm, norm_type); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, unit_pre_forward)) {
    vt.unit_pre_forward = [](hasten_instance* i, hasten_module* m, uint32_t unit) noexcept {
      return detail::call<Strategy>(i, [&](Strategy& s) { s.unit_pre_forward(module(m), unit); });
    };
    vt.unit_post_forward = [](hasten_instance* i, hasten_module* m, uint32_t unit, hasten_tensor* const* outs,
                              uint32_t n) noexcept {
      return detail::call<Strategy>(i, [&](Strategy& s) {
        s.unit_post_forward(module(m), unit, reinterpret_cast<at::Tensor* const*>(outs), n);
      });
    };
  }
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, memory_report))
    vt.memory_report = [](hasten_instance* i, hasten_memory_report* out) noexcept {
      return detail::call<Strategy>(i, [&](Strategy& s) {
        // Fill a full struct, hand back no more than the caller's (possibly older) one holds.
        hasten_memory_report mine{};
        mine.struct_size = sizeof(mine);
        mine.abi_version = HASTEN_ABI_VERSION;
        s.memory_report(mine);
        const size_t n = out->struct_size < sizeof(mine) ? out->struct_size : sizeof(mine);
        const uint32_t size = out->struct_size;
        std::memcpy(out, &mine, n);
        out->struct_size = size;
      });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, state_dict))
    vt.state_dict = [](hasten_instance* i, hasten_module* m, int32_t kind,
                       void (*emit)(void*, const char*, hasten_tensor*), void* ctx) noexcept {
      return detail::call<Strategy>(i, [&](Strategy& s) {
        s.state_dict(module(m), kind, [&](const std::string& name, at::Tensor& value) {
          emit(ctx, name.c_str(), handle(value));
        });
      });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, optimizer_state))
    vt.optimizer_state = [](hasten_instance* i, hasten_optimizer* o, hasten_module* m,
                            void (*emit)(void*, const char*, hasten_tensor*), void* ctx) noexcept {
      return detail::call<Strategy>(i, [&](Strategy& s) {
        s.optimizer_state(optimizer(o), module(m), [&](const std::string& name, at::Tensor& value) {
          emit(ctx, name.c_str(), handle(value));
        });
      });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, load_optimizer_state))
    vt.load_optimizer_state = [](hasten_instance* i, hasten_optimizer* o, hasten_module* m, const char* const* names,
                                 hasten_tensor* const* values, uint32_t n) noexcept {
      return detail::call<Strategy>(i, [&](Strategy& s) {
        Strategy::NamedTensorRefs tensors;
        for (uint32_t k = 0; k < n; ++k) tensors.emplace_back(names[k], &tensor(values[k]));
        s.load_optimizer_state(optimizer(o), module(m), tensors);
      });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, load_state_dict))
    vt.load_state_dict = [](hasten_instance* i, hasten_module* m, const char* const* names,
                            hasten_tensor* const* values, uint32_t n) noexcept {
      return detail::call<Strategy>(i, [&](Strategy& s) {
        Strategy::NamedTensorRefs tensors;
        for (uint32_t k = 0; k < n; ++k) tensors.emplace_back(names[k], &tensor(values[k]));
        s.load_state_dict(module(m), tensors);
      });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, load_state_dict_ranges))
    vt.load_state_dict_ranges =
        [](hasten_instance* i, hasten_module* m,
           hasten_status (*read)(void*, const char*, const int64_t*, uint32_t, int64_t, hasten_tensor*),
           void* ctx) noexcept {
          return detail::call<Strategy>(i, [&](Strategy& s) {
            s.load_state_dict_ranges(
                module(m), [&](const std::string& name, at::IntArrayRef shape, int64_t offset, at::Tensor& dst) {
                  const hasten_status st =
                      read(ctx, name.c_str(), shape.data(), static_cast<uint32_t>(shape.size()), offset, handle(dst));
                  // The host set the message; the status travels back unchanged.
                  if (st != HASTEN_OK) throw Error(st, "");
                });
          });
        };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Strategy, unit_built))
    vt.unit_built = [](hasten_instance* i, hasten_module* u, const hasten_model_info* info) noexcept {
      return detail::call<Strategy>(i, [&](Strategy& s) { s.unit_built(module(u), *info); });
    };
  return vt;
}
template <class T>
inline constexpr hasten_strategy_vtable strategy_vtable = make_strategy_vtable<T>();

template <class T>
constexpr hasten_plugin_descriptor strategy_descriptor(const char* name, const char* version,
                                                       const char* description,
                                                       const hasten_preset* presets = nullptr,
                                                       uint32_t n_presets = 0) {
  return make_descriptor(HASTEN_KIND_STRATEGY, name, version, description,
                         &strategy_vtable<T>, HASTEN_TORCH_FINGERPRINT, presets, n_presets);
}

class Precision : public PluginBase {
 public:
  using PluginBase::PluginBase;
  virtual void check_device(const DLDevice& device) { (void)device; }
  // Returns a token handed back to autocast_exit.
  virtual void* autocast_enter(const DLDevice& device) {
    (void)device;
    return nullptr;
  }
  virtual void autocast_exit(void* token) { (void)token; }
  virtual void scale_loss(at::Tensor& loss) { (void)loss; }
  virtual void unscale_gradients(torch::optim::Optimizer& optimizer) { (void)optimizer; }
  virtual bool before_step(torch::optim::Optimizer& optimizer) {  // true: skip the step
    (void)optimizer;
    return false;
  }
  virtual void after_step(torch::optim::Optimizer& optimizer, bool skipped) {
    (void)optimizer, (void)skipped;
  }
  virtual double loss_scale() { return 1.0; }
  // The state a checkpoint keeps, as one JSON object's text (ABI 1.7); override both or
  // neither. load_state_dict throws Error for a text it cannot read.
  virtual std::string state_dict() { return "{}"; }
  virtual void load_state_dict(const std::string& json) { (void)json; }
};

template <class T>
constexpr hasten_precision_vtable make_precision_vtable() {
  static_assert(std::is_base_of_v<Precision, T>, "T must derive from hasten::sdk::Precision");
  hasten_precision_vtable vt{};
  vt.struct_size = sizeof(vt);
  vt.abi_version = HASTEN_ABI_VERSION;
  vt.create = &detail::create<T, Precision>;
  vt.destroy = &detail::destroy<Precision>;
  if constexpr (HASTEN_SDK_OVERRIDES(T, Precision, check_device))
    vt.check_device = [](hasten_instance* i, DLDevice d) noexcept {
      return detail::call<Precision>(i, [&](Precision& p) { p.check_device(d); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Precision, autocast_enter)) {
    vt.autocast_enter = [](hasten_instance* i, DLDevice d, void** token) noexcept {
      return detail::call<Precision>(i, [&](Precision& p) { *token = p.autocast_enter(d); });
    };
    vt.autocast_exit = [](hasten_instance* i, void* token) noexcept {
      return detail::call<Precision>(i, [&](Precision& p) { p.autocast_exit(token); });
    };
  }
  if constexpr (HASTEN_SDK_OVERRIDES(T, Precision, scale_loss))
    vt.scale_loss = [](hasten_instance* i, hasten_tensor* loss) noexcept {
      return detail::call<Precision>(i, [&](Precision& p) { p.scale_loss(tensor(loss)); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Precision, unscale_gradients))
    vt.unscale_gradients = [](hasten_instance* i, hasten_optimizer* o) noexcept {
      return detail::call<Precision>(i, [&](Precision& p) { p.unscale_gradients(optimizer(o)); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Precision, before_step))
    vt.before_step = [](hasten_instance* i, hasten_optimizer* o, int32_t* skip) noexcept {
      return detail::call<Precision>(
          i, [&](Precision& p) { *skip = p.before_step(optimizer(o)) ? 1 : 0; });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Precision, after_step))
    vt.after_step = [](hasten_instance* i, hasten_optimizer* o, int32_t skipped) noexcept {
      return detail::call<Precision>(
          i, [&](Precision& p) { p.after_step(optimizer(o), skipped != 0); });
    };
  if constexpr (HASTEN_SDK_OVERRIDES(T, Precision, loss_scale))
    vt.loss_scale = [](hasten_instance* i, double* scale) noexcept {
      return detail::call<Precision>(i, [&](Precision& p) { *scale = p.loss_scale(); });
    };
  static_assert(HASTEN_SDK_OVERRIDES(T, Precision, state_dict) == HASTEN_SDK_OVERRIDES(T, Precision, load_state_dict),
                "a precision that saves state must also load it (override state_dict and load_state_dict)");
  if constexpr (HASTEN_SDK_OVERRIDES(T, Precision, state_dict)) {
    vt.state_dict = [](hasten_instance* i, char* buffer, size_t capacity, size_t* size) noexcept {
      return detail::call<Precision>(i, [&](Precision& p) {
        const std::string text = p.state_dict();
        *size = text.size() + 1;
        if (capacity == 0) return;
        if (capacity < *size)
          throw Error(HASTEN_ERR_INVALID_ARGUMENT, "precision state_dict: a buffer of " + std::to_string(capacity) +
                                                       " bytes, " + std::to_string(*size) + " needed");
        std::memcpy(buffer, text.c_str(), *size);
      });
    };
    vt.load_state_dict = [](hasten_instance* i, const char* json) noexcept {
      return detail::call<Precision>(i, [&](Precision& p) { p.load_state_dict(json); });
    };
  }
  return vt;
}
template <class T>
inline constexpr hasten_precision_vtable precision_vtable = make_precision_vtable<T>();

template <class T>
constexpr hasten_plugin_descriptor precision_descriptor(const char* name, const char* version,
                                                        const char* description) {
  return make_descriptor(HASTEN_KIND_PRECISION, name, version, description,
                         &precision_vtable<T>, HASTEN_TORCH_FINGERPRINT);
}

}  // namespace v1
}  // namespace hasten::sdk

#endif  // HASTEN_PLUGIN_TORCH_HPP
