// A torch optimizer's state by parameter, for strategies that shard or offload it and for the
// host's checkpoints: its size, its tensors named by parameter, and setting them back.
// Header-only; nothing here is ABI.
#ifndef HASTEN_PLUGIN_OPTIMIZER_STATE_HPP
#define HASTEN_PLUGIN_OPTIMIZER_STATE_HPP

#include <hasten/plugin_torch.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hasten::sdk {
inline namespace v1 {

// Bytes of the state tensors of LibTorch's optimizers (SGD, Adam, AdamW, RMSprop, Adagrad).
inline uint64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer) {
  uint64_t bytes = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined()) bytes += static_cast<uint64_t>(t.numel()) * t.element_size();
  };
  for (auto& [key, state] : optimizer.state()) {
    (void)key;
    if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
      add(s->exp_avg()), add(s->exp_avg_sq()), add(s->max_exp_avg_sq());
    } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
      add(s->exp_avg()), add(s->exp_avg_sq()), add(s->max_exp_avg_sq());
    } else if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
      add(s->momentum_buffer());
    } else if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(state.get())) {
      add(s->square_avg()), add(s->momentum_buffer()), add(s->grad_avg());
    } else if (auto* s = dynamic_cast<torch::optim::AdagradParamState*>(state.get())) {
      add(s->sum());
    }
  }
  return bytes;
}

// One parameter's optimizer state as named tensors, for LibTorch's SGD, Adam, AdamW, RMSprop
// and Adagrad: "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg",
// "grad_avg", "sum" (shaped like the parameter) and "step" (a 0-d int64). Empty when the
// parameter has no state yet. Another optimizer type throws Error(HASTEN_ERR_UNSUPPORTED).
inline std::vector<std::pair<std::string, at::Tensor>> param_state(torch::optim::Optimizer& optimizer,
                                                                   const at::Tensor& param) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto it = optimizer.state().find(compat::state_key(param));
  if (it == optimizer.state().end()) return out;
  auto put = [&](const char* key, const at::Tensor& t) {
    if (t.defined()) out.emplace_back(key, t);
  };
  auto step = [&](int64_t n) { out.emplace_back("step", at::scalar_tensor(n, at::kLong)); };
  auto* state = it->second.get();
  if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(state)) {
    step(s->step()), put("exp_avg", s->exp_avg()), put("exp_avg_sq", s->exp_avg_sq()), put("max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(state)) {
    step(s->step()), put("exp_avg", s->exp_avg()), put("exp_avg_sq", s->exp_avg_sq()), put("max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(state)) {
    put("momentum_buffer", s->momentum_buffer());
  } else if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(state)) {
    step(s->step()), put("square_avg", s->square_avg()), put("momentum_buffer", s->momentum_buffer()), put("grad_avg", s->grad_avg());
  } else if (auto* s = dynamic_cast<torch::optim::AdagradParamState*>(state)) {
    step(s->step()), put("sum", s->sum());
  } else {
    throw Error(HASTEN_ERR_UNSUPPORTED, "the optimizer's state is of a type hasten cannot read (SGD, Adam, AdamW, "
                                        "RMSprop and Adagrad are supported)");
  }
  return out;
}

// Sets one parameter's optimizer state from tensors keyed as param_state() names them (each
// on the parameter's device and dtype, shaped like it; "step" read as an integer). A tensor
// that already is exactly that, owning all of its memory, is taken as it is (the optimizer
// then shares it with the caller); anything else (a view into a larger buffer) is copied.
inline void set_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                            const std::map<std::string, at::Tensor>& state) {
  if (state.empty()) return;
  auto get = [&](const char* key) -> at::Tensor {
    auto it = state.find(key);
    if (it == state.end()) return at::Tensor();
    at::Tensor t = it->second.to(param.device(), param.scalar_type()).reshape(param.sizes());
    const bool whole = t.is_contiguous() && t.storage_offset() == 0 &&
                       t.storage().nbytes() == static_cast<size_t>(t.numel()) * t.element_size();
    return whole ? t : t.clone();
  };
  const int64_t step = state.count("step") ? state.at("step").item<int64_t>() : 0;
  std::unique_ptr<torch::optim::OptimizerParamState> made;
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(step), s->exp_avg(get("exp_avg")), s->exp_avg_sq(get("exp_avg_sq")), s->max_exp_avg_sq(get("max_exp_avg_sq"));
    made = std::move(s);
  } else if (dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr) {
    auto s = std::make_unique<torch::optim::AdamParamState>();
    s->step(step), s->exp_avg(get("exp_avg")), s->exp_avg_sq(get("exp_avg_sq")), s->max_exp_avg_sq(get("max_exp_avg_sq"));
    made = std::move(s);
  } else if (dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr) {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(get("momentum_buffer"));
    made = std::move(s);
  } else if (dynamic_cast<torch::optim::RMSprop*>(&optimizer) != nullptr) {
    auto s = std::make_unique<torch::optim::RMSpropParamState>();
    s->step(step), s->square_avg(get("square_avg")), s->momentum_buffer(get("momentum_buffer")), s->grad_avg(get("grad_avg"));
    made = std::move(s);
  } else if (dynamic_cast<torch::optim::Adagrad*>(&optimizer) != nullptr) {
    auto s = std::make_unique<torch::optim::AdagradParamState>();
    s->step(step), s->sum(get("sum"));
    made = std::move(s);
  } else {
    throw Error(HASTEN_ERR_UNSUPPORTED, "the optimizer is of a type hasten cannot set state for (SGD, Adam, AdamW, "
                                        "RMSprop and Adagrad are supported)");
  }
  optimizer.state()[compat::state_key(param)] = std::move(made);
}

}  // namespace v1
}  // namespace hasten::sdk

#endif  // HASTEN_PLUGIN_OPTIMIZER_STATE_HPP
