// hasten::PreparedModel: a model after Accelerator::prepare, whose forward runs inside the
// precision plugin's autocast region and reports to the strategy's unit events.
#pragma once

#include <hasten/detail/engine.hpp>
#include <hasten/error.hpp>
#include <hasten/unit.hpp>

#include <ATen/record_function.h>
#include <torch/types.h>

#include <exception>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace hasten {

namespace detail {

// Outputs of a mixed-precision forward come back as float32, as Accelerate does.
inline torch::Tensor to_float_output(const torch::Tensor& t) {
  if (t.defined() && (t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf))
    return t.to(torch::kFloat);
  return t;
}
// Tensors, vectors of them and tuples of those, as outputs_of finds them.
template <class T>
void to_float_in_place(T& value) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, torch::Tensor>) {
    value = to_float_output(value);
  } else if constexpr (std::is_same_v<D, std::vector<torch::Tensor>>) {
    for (auto& t : value) t = to_float_output(t);
  } else if constexpr (is_tuple_like<D>::value) {
    std::apply([](auto&... parts) { (to_float_in_place(parts), ...); }, value);
  }
}
template <class T>
T to_float_outputs(T&& value) {
  to_float_in_place(value);
  return std::forward<T>(value);
}

// The autocast region of one forward call.
class AutocastGuard {
 public:
  explicit AutocastGuard(Engine& engine) : engine_(&engine), token_(engine.autocast_enter()) {}
  ~AutocastGuard() { engine_->autocast_exit(token_); }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  Engine* engine_;
  void* token_;
};

}  // namespace detail

// A model after prepare: call it like the module (autocast and the strategy's hooks wrap
// the forward); `->` reaches the module's members. `model->forward(x)` reaches the module's
// own forward past both: a backward through such a call is refused (Engine::backward).
template <class M>
class PreparedModel {
 public:
  using module_type = M;
  PreparedModel(M module, std::shared_ptr<detail::Engine> engine, size_t index)
      : module_(std::move(module)), engine_(std::move(engine)), index_(index) {}

  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  template <class... Args>
  auto forward(Args&&... args) {
    RECORD_USER_SCOPE("hasten::forward");  // a range in any LibTorch profile (config key profile)
    engine_->forward_begins();
    engine_->model_called(index_);
    detail::AutocastGuard autocast(*engine_);
    if (!engine_->unit_events()) {
      auto out = module_->forward(std::forward<Args>(args)...);
      std::vector<torch::Tensor> outputs;
      detail::outputs_of(out, outputs);
      engine_->model_forward_outputs(index_, outputs);
      return detail::to_float_outputs(std::move(out));
    }
    // A sharding strategy: unit 0 (the model's own parameters) around the whole forward.
    engine_->model_forward_enter(index_);
    try {
      auto out = module_->forward(std::forward<Args>(args)...);
      std::vector<torch::Tensor> outputs;
      detail::outputs_of(out, outputs);
      engine_->model_forward_exit(index_, outputs);
      return detail::to_float_outputs(std::move(out));
    } catch (const hasten::Error&) {
      throw;
    } catch (const std::exception& e) {
      engine_->forward_failed(index_, e);
    }
  }
  auto operator->() const { return module_.get(); }
  // The user's module, as passed to prepare (hasten::Accelerator::unwrap_model does the same).
  const M& module() const { return module_; }
  size_t index() const { return index_; }
  std::vector<torch::Tensor> parameters() const { return module_->parameters(); }
  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }

 private:
  M module_;
  std::shared_ptr<detail::Engine> engine_;
  size_t index_;
};

}  // namespace hasten
