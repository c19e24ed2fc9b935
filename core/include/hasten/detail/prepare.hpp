// How Accelerator::prepare takes each object (accelerator.hpp): a compile-time refusal that says
// what to pass instead, models registered first, then each object wrapped in its Prepared type.
// Not part of the API.
#pragma once

#include <hasten/data.hpp>
#include <hasten/detail/engine.hpp>
#include <hasten/detail/prepare_traits.hpp>
#include <hasten/prepared_data_loader.hpp>
#include <hasten/prepared_model.hpp>
#include <hasten/prepared_optimizer.hpp>
#include <hasten/prepared_scheduler.hpp>

#include <memory>
#include <type_traits>
#include <utility>

namespace hasten::detail {

// One static_assert per argument, chosen so that a LibTorch loader or a bare dataset gets
// the message that says what to do instead.
template <class T>
constexpr void check_preparable() {
  using D = std::decay_t<T>;
  if constexpr (is_model_v<T> || is_optimizer_v<T> || is_scheduler_v<T> ||
                is_loader_v<T>) {
    if constexpr ((is_optimizer_v<T> || is_scheduler_v<T>) &&
                  !is_shared_ptr<D>::value)
      static_assert(std::is_lvalue_reference_v<T>,
                    "pass optimizers and schedulers as lvalues (you keep them alive) or as "
                    "shared_ptr");
  } else if constexpr (is_torch_loader_v<T>) {
    static_assert(always_false<T>,
                  "wrap the dataset in hasten::DataLoader(dataset, {.batch_size = ...}): prepare() "
                  "does not take LibTorch data loaders (torch::data::make_data_loader); "
                  "hasten::DataLoader shards the dataset across processes and its batches keep "
                  "LibTorch's .data and .target");
  } else if constexpr (is_torch_dataset_v<D> || is_hasten_dataset_v<D>) {
    static_assert(always_false<T>,
                  "wrap the dataset in hasten::DataLoader(dataset, {.batch_size = ...}): prepare() "
                  "takes data loaders, not datasets");
  } else {
    static_assert(always_false<T>,
                  "prepare() takes models (shared_ptr<Module> or module holders), optimizers, "
                  "schedulers and hasten::DataLoader objects");
  }
}

template <class T>
void prepare_model_pass(Engine& engine, T& object) {
  if constexpr (is_model_v<T>) {
    auto ptr = module_ptr(object);
    if (!engine.find_model(ptr.get())) engine.add_model(ptr);
  }
}

template <class T>
typename prepared<T>::type prepare_one(const std::shared_ptr<Engine>& engine_, T&& object) {
  using D = std::decay_t<T>;
  if constexpr (is_model_v<T>) {
    auto ptr = module_ptr(object);
    return PreparedModel<D>(object, engine_, *engine_->find_model(ptr.get()));
  } else if constexpr (is_optimizer_v<T>) {
    if constexpr (is_shared_ptr<D>::value)
      return PreparedOptimizer(engine_, engine_->add_optimizer(*object, object));
    else
      return PreparedOptimizer(engine_, engine_->add_optimizer(object, nullptr));
  } else if constexpr (is_scheduler_v<T>) {
    using S = bare_t<T>;
    if constexpr (is_shared_ptr<D>::value)
      return PreparedScheduler<S>(object, engine_);
    else  // borrowed: the caller keeps it alive
      return PreparedScheduler<S>(std::shared_ptr<S>(std::shared_ptr<S>(), &object), engine_);
  } else if constexpr (std::is_same_v<typename prepared<T>::type, unpreparable>) {
    return {};  // refused by check_preparable or by DataLoader: no second error
  } else {
    using Dataset = typename D::dataset_type;
    if constexpr (is_stream_dataset_v<Dataset>) {
      const size_t id = engine_->add_stream_loader(object.options());
      return PreparedDataLoader<Dataset>(object.dataset_ptr(), engine_, id, engine_->device(),
                                         object.options().drop_last);
    } else {
      const size_t id = engine_->add_loader(static_cast<int64_t>(object.dataset_size()),
                                            object.options());
      return PreparedDataLoader<Dataset>(object.dataset_ptr(), engine_, id, engine_->device(),
                                         BatchReading::of(object.options()));
    }
  }
}

}  // namespace hasten::detail
