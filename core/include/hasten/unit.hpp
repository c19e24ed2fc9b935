// Sharding units: the C++ counterpart of FSDP's auto-wrap policy.
//
// LibTorch modules have no forward hooks and a non-virtual forward, so a sharding strategy
// cannot see when a submodule runs. A unit is the module itself with a forward that shadows
// the original one and tells the strategy before and after it runs (ZeRO-3/FULL_SHARD gather
// the unit's parameters there and free them after). Declare units by type:
//
//   struct NetImpl : torch::nn::Module {
//     hasten::Unit<torch::nn::Linear> fc1{nullptr}, fc2{nullptr};   // was: torch::nn::Linear
//     NetImpl() { fc1 = register_module("fc1", hasten::Unit<torch::nn::Linear>(784, 256)); ... }
//   };
//   seq->push_back(hasten::Unit<torch::nn::Linear>(1024, 4096));    // inside Sequential too
//
// A unit is-a LinearImpl (same parameter names, initialisation and members: fc1->weight).
// A model that declares no units is one unit; the parameters that no nested unit owns belong
// to the model itself (unit 0). Rules (docs/strategies.md):
// - call a unit through its Unit type: a call through a base-class pointer
//   (`->as<LinearImpl>()->forward`) bypasses it, and under ZeRO-3 finds its parameters freed
//   (an error, never a crash);
// - a unit's forward keeps the exact signature of the module's forward, so arguments with
//   default values must be passed (TransformerEncoderLayer: forward(src, mask, {}));
// - modules whose forward is a template (Sequential) get a forwarding template instead.
// Outside a sharding strategy a unit behaves exactly like its module.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>

#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace hasten {

namespace detail {
class Engine;
class UnitStream;
}

// What the Accelerator finds in a model's modules() and connects to the strategy.
class UnitBase {
 public:
  virtual ~UnitBase();
  bool hasten_attached() const noexcept { return engine_ != nullptr || stream_ != nullptr || device_.has_value(); }
  // Where a dispatched unit runs (load_checkpoint_and_dispatch with GPUs in its map): its
  // forward's tensor arguments are moved there first, as Accelerate's AlignDevicesHook does, so
  // units on different devices chain. Unset: arguments are taken as passed.
  const std::optional<torch::Device>& hasten_device() const noexcept { return device_; }
  // Activation checkpointing (Accelerator::checkpoint_activations, config key
  // activation_checkpointing): the unit's forward keeps no activations and runs again in
  // backward. Its forward must return one tensor.
  bool hasten_checkpointed() const noexcept { return checkpointed_; }
  void hasten_set_checkpointed(bool on) noexcept { checkpointed_ = on; }
  // Whether its forward can be checkpointed: one signature, returning a tensor, whose arguments
  // are tensors (also optional or in a vector), numbers, enums or strings (a template forward,
  // Sequential's, cannot: checkpoint the units inside it).
  virtual bool hasten_checkpointable() const noexcept { return false; }

 protected:
  UnitBase() = default;
  UnitBase(const UnitBase&) : UnitBase() {}  // a copy is a new, unattached unit
  UnitBase& operator=(const UnitBase&) noexcept { return *this; }  // and keeps its own attachment

 public:  // called by the unit forwards (detail::unit_forward)
  void hasten_enter();
  void hasten_exit(std::vector<torch::Tensor>& outputs);
  // The forward threw after hasten_enter: what hasten_enter took (weights read from disk) is
  // let go; a strategy's state is the Accelerator's to reset.
  void hasten_abort() noexcept;

 private:
  friend class detail::Engine;
  friend class detail::UnitStream;
  detail::Engine* engine_ = nullptr;
  size_t model_ = 0;
  uint32_t unit_ = 0;
  bool checkpointed_ = false;
  // Big-model inference (big_modeling.hpp): the unit's weights are read from disk before each
  // forward and dropped after it.
  std::shared_ptr<detail::UnitStream> stream_;
  std::optional<torch::Device> device_;
};

namespace detail {

// Tells the Accelerator building this model sharded (Config::sharded_init) that a unit's
// constructor has finished; nothing otherwise (sharded_build.cpp).
void unit_built(torch::nn::Module& unit);

// A member of every unit, so constructed after the module itself: its constructor is the
// moment the unit's parameters are initialised. A copy (Module::clone) is not a new build.
struct UnitBuiltSignal {
  explicit UnitBuiltSignal(torch::nn::Module& unit) { unit_built(unit); }
  UnitBuiltSignal(const UnitBuiltSignal&) noexcept {}
  UnitBuiltSignal& operator=(const UnitBuiltSignal&) noexcept { return *this; }
};

template <class T, class = void>
struct is_tuple_like : std::false_type {};
template <class T>
struct is_tuple_like<T, std::void_t<decltype(std::tuple_size<std::decay_t<T>>::value)>> : std::true_type {};

// The tensors among a forward's outputs: a tensor, a vector of tensors, or tuples of those.
template <class T>
void outputs_of(T& value, std::vector<torch::Tensor>& out) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, torch::Tensor>) {
    if (value.defined()) out.push_back(value);
  } else if constexpr (std::is_same_v<D, std::vector<torch::Tensor>>) {
    for (auto& t : value) outputs_of(t, out);
  } else if constexpr (is_tuple_like<D>::value) {
    std::apply([&](auto&... parts) { (outputs_of(parts, out), ...); }, value);
  }
}

// forward's signature as a plain function type R(A...) (a const forward's too), or void when
// forward is a template or overloaded.
template <class M>
struct plain_signature {
  using type = void;
};
template <class R, class C, class... A>
struct plain_signature<R (C::*)(A...)> {
  using type = R(A...);
};
template <class R, class C, class... A>
struct plain_signature<R (C::*)(A...) const> {
  using type = R(A...);
};
template <class T, class = void>
struct forward_signature {
  using type = void;
};
template <class T>
struct forward_signature<T, std::void_t<decltype(&T::forward)>> {
  using type = typename plain_signature<decltype(&T::forward)>::type;
};

}  // namespace detail

namespace detail {
// The body every unit forward shares: report before, run the module's forward, report after
// with the outputs (nothing to report when no strategy is attached).
template <class Unit, class Call>
decltype(auto) unit_forward(Unit& unit, Call&& call) {
  if (!unit.hasten_attached()) return call();
  unit.hasten_enter();
  struct AbortOnThrow {
    Unit& unit;
    bool done = false;
    ~AbortOnThrow() {
      if (!done) unit.hasten_abort();
    }
  } guard{unit};
  decltype(auto) out = call();
  guard.done = true;
  std::vector<torch::Tensor> outputs;
  outputs_of(out, outputs);
  unit.hasten_exit(outputs);
  return out;
}

// Runs `run(inputs)` keeping none of its activations, and again in backward (reentrant, with
// the forward's RNG and autocast state) to produce the gradients of `inputs` and of whatever
// its graph reaches (the unit's parameters). Returns run's outputs (activation_checkpoint.cpp).
std::vector<torch::Tensor> run_checkpointed(
    std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)> run,
    const std::vector<torch::Tensor>& inputs);
[[noreturn]] void refuse_checkpointed_output(const char* type);

// The tensors of a checkpointed forward's arguments: a tensor, an optional tensor, a vector of
// tensors (what the recompute gets detached copies of). Tensors inside other types would keep
// their link to the graph before the unit: such a forward is not checkpointable (below).
template <class T>
void collect_tensor(const T& arg, std::vector<torch::Tensor>& out) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, torch::Tensor>) {
    out.push_back(arg);
  } else if constexpr (std::is_same_v<D, std::optional<torch::Tensor>>) {
    if (arg) out.push_back(*arg);
  } else if constexpr (std::is_same_v<D, std::vector<torch::Tensor>>) {
    out.insert(out.end(), arg.begin(), arg.end());
  }
}
template <class T>
void substitute_tensor(T& arg, const std::vector<torch::Tensor>& in, size_t& k) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, torch::Tensor>) {
    arg = in.at(k++);
  } else if constexpr (std::is_same_v<D, std::optional<torch::Tensor>>) {
    if (arg) arg = in.at(k++);
  } else if constexpr (std::is_same_v<D, std::vector<torch::Tensor>>) {
    for (auto& t : arg) t = in.at(k++);
  }
}
// An argument a checkpointed forward can keep and pass again: a copyable value, not an rvalue
// reference, and no tensor hidden in a type the recompute cannot detach.
template <class A>
constexpr bool keepable_argument_v =
    !std::is_rvalue_reference_v<A> && std::is_copy_constructible_v<std::decay_t<A>> &&
    (std::is_arithmetic_v<std::decay_t<A>> || std::is_enum_v<std::decay_t<A>> ||
     std::is_same_v<std::decay_t<A>, torch::Tensor> || std::is_same_v<std::decay_t<A>, std::optional<torch::Tensor>> ||
     std::is_same_v<std::decay_t<A>, std::vector<torch::Tensor>> || std::is_same_v<std::decay_t<A>, std::string>);
template <class R, class... A>
constexpr bool checkpointable_v = std::is_same_v<std::decay_t<R>, torch::Tensor> && (keepable_argument_v<A> && ...);

// An argument of a dispatched unit's forward on the unit's device (hasten_device). A is the
// forward's parameter type: a tensor (also optional or in a vector) it takes by value or by const
// reference is passed as a copy on the device (the same tensor where it is there already);
// anything else, a non-const tensor reference or tensors inside tuples and structs included, is
// passed as it is (a forward returning a reference gets its arguments as passed: it could
// return one of the copies).
template <class A, class T>
decltype(auto) on_device(T&& arg, const torch::Device& device) {
  using D = std::decay_t<T>;
  constexpr bool replaceable = !(std::is_lvalue_reference_v<A> && !std::is_const_v<std::remove_reference_t<A>>);
  if constexpr (replaceable && std::is_same_v<D, torch::Tensor>) {
    return arg.defined() ? arg.to(device) : torch::Tensor(arg);
  } else if constexpr (replaceable && std::is_same_v<D, std::optional<torch::Tensor>>) {
    return arg && arg->defined() ? std::optional<torch::Tensor>(arg->to(device)) : std::optional<torch::Tensor>(arg);
  } else if constexpr (replaceable && std::is_same_v<D, std::vector<torch::Tensor>>) {
    std::vector<torch::Tensor> out;
    out.reserve(arg.size());
    for (const auto& t : arg) out.push_back(t.defined() ? t.to(device) : t);
    return out;
  } else {
    return static_cast<T&&>(arg);
  }
}

// A checkpointed unit's forward: the arguments are kept (tensors as the inputs the recompute
// gets detached copies of), and both runs go through unit_forward, so a sharding strategy
// gathers the unit's parameters for the recompute as for the forward.
template <class R, class Unit, class Fn, class... A>
R checkpointed_forward(Unit& unit, Fn fn, A&&... args) {
  if constexpr (!std::is_same_v<std::decay_t<R>, torch::Tensor>) {
    refuse_checkpointed_output(typeid(R).name());
  } else {
    auto stored = std::make_shared<std::tuple<std::decay_t<A>...>>(std::forward<A>(args)...);
    std::vector<torch::Tensor> inputs;
    std::apply([&](const auto&... a) { (collect_tensor(a, inputs), ...); }, *stored);
    auto run = [&unit, fn, stored](const std::vector<torch::Tensor>& in) {
      auto call_args = *stored;
      size_t k = 0;
      std::apply([&](auto&... a) { (substitute_tensor(a, in, k), ...); }, call_args);
      torch::Tensor out = unit_forward(unit, [&]() -> R { return std::apply(fn, call_args); });
      return std::vector<torch::Tensor>{out};
    };
    return run_checkpointed(std::move(run), inputs).at(0);
  }
}

}  // namespace detail

template <class Impl, class Signature = typename detail::forward_signature<Impl>::type>
class UnitImpl;

// forward with the module's exact signature, const or not (so AnyModule and Sequential accept
// units).
template <class Impl, class R, class... A>
class UnitImpl<Impl, R(A...)> : public Impl, public UnitBase {
 public:
  using Impl::Impl;
  UnitImpl() = default;
  bool hasten_checkpointable() const noexcept override { return detail::checkpointable_v<R, A...>; }
  R forward(A... args) {
    if constexpr (!std::is_reference_v<R>)
      if (const auto& device = this->hasten_device())
        return hasten_forward(detail::on_device<A>(std::forward<A>(args), *device)...);
    return hasten_forward(std::forward<A>(args)...);
  }

 private:
  R hasten_forward(A... args) {
    if constexpr (detail::checkpointable_v<R, A...>)
      if (this->hasten_checkpointed() && torch::GradMode::is_enabled())
        return detail::checkpointed_forward<R>(
            *this, [this](auto&&... a) -> R { return Impl::forward(std::forward<decltype(a)>(a)...); },
            std::forward<A>(args)...);
    return detail::unit_forward(*this, [&]() -> R { return Impl::forward(std::forward<A>(args)...); });
  }

  detail::UnitBuiltSignal hasten_built_{*this};
};

// A forward that is a template or overloaded (Sequential): forward whatever is passed.
template <class Impl>
class UnitImpl<Impl, void> : public Impl, public UnitBase {
 public:
  using Impl::Impl;
  UnitImpl() = default;
  template <class... A>
  decltype(auto) forward(A&&... args) {
    if (const auto& device = this->hasten_device())
      return hasten_forward(detail::on_device<std::decay_t<A>>(std::forward<A>(args), *device)...);
    return hasten_forward(std::forward<A>(args)...);
  }

 private:
  template <class... A>
  decltype(auto) hasten_forward(A&&... args) {
    return detail::unit_forward(*this, [&]() -> decltype(auto) { return Impl::forward(std::forward<A>(args)...); });
  }

  detail::UnitBuiltSignal hasten_built_{*this};
};

// The holder of a unit: hasten::Unit<torch::nn::Linear> is used like torch::nn::Linear.
template <class Holder>
using Unit = torch::nn::ModuleHolder<UnitImpl<typename Holder::ContainedType>>;

// Bytes held on this rank (Accelerator::memory_report), now and at their peak.
struct MemoryReport {
  uint64_t params = 0;        // full parameters currently allocated
  uint64_t param_shards = 0;  // parameter shards (float32 masters included)
  uint64_t grads = 0;         // gradients, full and sharded
  uint64_t optimizer = 0;     // optimizer state
  uint64_t peak_params = 0;
  uint64_t peak_param_shards = 0;
  uint64_t peak_grads = 0;
  uint64_t peak_optimizer = 0;
  uint64_t at_rest() const { return params + param_shards + grads + optimizer; }
};

}  // namespace hasten
