// What Accelerator::prepare accepts and returns: traits that sort its arguments into models,
// optimizers, schedulers and loaders, and prepared<T>, the prepared type for each.
#pragma once

#include <hasten/data.hpp>
#include <hasten/prepared_data_loader.hpp>
#include <hasten/prepared_model.hpp>
#include <hasten/prepared_optimizer.hpp>
#include <hasten/prepared_scheduler.hpp>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <memory>
#include <type_traits>

namespace hasten::detail {

template <class T>
struct is_shared_ptr : std::false_type {};
template <class T>
struct is_shared_ptr<std::shared_ptr<T>> : std::true_type {};

template <class T>
struct is_prepared_model : std::false_type {};
template <class M>
struct is_prepared_model<PreparedModel<M>> : std::true_type {};

// The module behind a model argument: a prepared model's, a module, a shared_ptr's pointee,
// a module holder's (TORCH_MODULE, hasten::Unit<...>).
template <class M>
torch::nn::Module& module_of(const M& m) {
  if constexpr (is_prepared_model<M>::value)
    return module_of(m.module());
  else if constexpr (std::is_base_of_v<torch::nn::Module, M>)
    return const_cast<M&>(m);
  else if constexpr (is_shared_ptr<M>::value)
    return *m;
  else
    return *m.ptr();
}

template <class T>
struct is_data_loader : std::false_type {};
template <class D>
struct is_data_loader<DataLoader<D>> : std::true_type {};

template <class T>
struct pointee {
  using type = T;
};
template <class T>
struct pointee<std::shared_ptr<T>> {
  using type = T;
};

template <class T>
using bare_t = typename pointee<std::decay_t<T>>::type;

template <class T>
constexpr bool is_model_v =
    torch::detail::is_module_holder<std::decay_t<T>>::value ||
    (is_shared_ptr<std::decay_t<T>>::value && std::is_base_of_v<torch::nn::Module, bare_t<T>>);
template <class T>
constexpr bool is_optimizer_v = std::is_base_of_v<torch::optim::Optimizer, bare_t<T>>;
template <class T>
constexpr bool is_scheduler_v = std::is_base_of_v<torch::optim::LRScheduler, bare_t<T>>;
template <class T>
constexpr bool is_loader_v = is_data_loader<std::decay_t<T>>::value;

// The module class behind a model argument: a holder's Impl, or a shared_ptr's pointee.
template <class M, class = void>
struct module_impl {
  using type = typename M::element_type;
};
template <class M>
struct module_impl<M, std::enable_if_t<torch::detail::is_module_holder<M>::value>> {
  using type = typename M::ContainedType;
};
template <class M>
using module_impl_t = typename module_impl<M>::type;

template <class M>
std::shared_ptr<torch::nn::Module> module_ptr(const M& model) {
  if constexpr (torch::detail::is_module_holder<M>::value)
    return model.ptr();
  else
    return model;
}

// What prepare() returns for an argument it refuses at compile time: an empty type, so that
// check_preparable's static_assert is the only error (not a cascade from the return type).
struct unpreparable {};

template <class>
inline constexpr bool always_false = false;

// prepared<T>::type: what prepare() returns for an argument of type T.
template <class T>
struct tag {
  using type = T;
};
template <class T>
struct prepared {
  using D = std::decay_t<T>;
  static auto pick() {
    if constexpr (is_model_v<T>)
      return tag<PreparedModel<D>>{};
    else if constexpr (is_optimizer_v<T>)
      return tag<PreparedOptimizer>{};
    else if constexpr (is_scheduler_v<T>)
      return tag<PreparedScheduler<bare_t<T>>>{};
    else if constexpr (is_loader_v<T>) {
      // A DataLoader of something it cannot load is refused by DataLoader itself.
      if constexpr (is_loadable_v<typename D::dataset_type>)
        return tag<PreparedDataLoader<typename D::dataset_type>>{};
      else
        return tag<unpreparable>{};
    } else {
      return tag<unpreparable>{};
    }
  }
  using type = typename decltype(pick())::type;
};

}  // namespace hasten::detail
