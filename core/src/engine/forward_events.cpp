// Around a prepared model's forward: the strategy's unit events (unit 0 for the model, one per
// hasten::Unit), the precision plugin's autocast region, and the error for a failed forward.
#include <hasten/error.hpp>
#include <hasten/logging.hpp>

#include "engine/engine_state.hpp"
#include "offload/unit_stream.hpp"

namespace hasten::detail {

bool Engine::unit_events() const { return impl_->unit_events; }

void Engine::model_forward_enter(size_t model) {
  ModelEntry& m = impl_->models.at(model);
  if (impl_->unit_events && !m.root_is_unit) impl_->strategy->unit_pre_forward(*m.module, 0);
}

void Engine::model_forward_exit(size_t model, std::vector<torch::Tensor>& outputs) {
  model_forward_outputs(model, outputs);  // before the strategy sees (and may wrap) them
  ModelEntry& m = impl_->models.at(model);
  if (impl_->unit_events && !m.root_is_unit) impl_->strategy->unit_post_forward(*m.module, 0, outputs);
}

void Engine::unit_enter(size_t model, uint32_t unit) {
  impl_->strategy->unit_pre_forward(*impl_->models.at(model).module, unit);
}

void Engine::unit_exit(size_t model, uint32_t unit, std::vector<torch::Tensor>& outputs) {
  impl_->strategy->unit_post_forward(*impl_->models.at(model).module, unit, outputs);
}

void Engine::forward_failed(size_t model, const std::exception& error) {
  (void)model;
  const std::string what = error.what();
  // A bypassed unit under a parameter-sharding strategy finds its parameters empty.
  throw UsageError("the forward of a prepared model failed under strategy '" + impl_->strategy->name() +
                   "', which frees the parameters of units between uses: if a hasten::Unit was called through a "
                   "base-class pointer or an AnyModule built from its base type, call it through its Unit type. "
                   "LibTorch said: " + what.substr(0, what.find('\n')));
}

void Engine::forward_begins() {
  if (!impl_->checkpoints.resume_settled) resume();
}

void* Engine::autocast_enter() {
  if (!impl_->precision_autocast) return nullptr;
  return impl_->precision->autocast_enter(impl_->dl_device);
}

void Engine::autocast_exit(void* token) noexcept {
  if (!impl_->precision_autocast) return;
  try {
    impl_->precision->autocast_exit(token);
  } catch (const std::exception& e) {
    get_logger()->error("{}", e.what());
  }
}

}  // namespace hasten::detail

namespace hasten {

void UnitBase::hasten_enter() {
  if (stream_ != nullptr) stream_->read_in();
  if (engine_ != nullptr) engine_->unit_enter(model_, unit_);
}

void UnitBase::hasten_exit(std::vector<torch::Tensor>& outputs) {
  if (engine_ != nullptr) engine_->unit_exit(model_, unit_, outputs);
  if (stream_ != nullptr) stream_->drop();
}

void UnitBase::hasten_abort() noexcept {
  try {
    if (stream_ != nullptr) stream_->drop();
  } catch (...) {  // the forward's own exception is the one to report
  }
}

}  // namespace hasten
