// EmptyWeights (hasten/big_modeling.hpp): units built while one lives drop their weights as
// their constructors return (sharded_build.cpp's unit_built asks), remembering each tensor's
// shape for load_checkpoint_and_dispatch.
#include <hasten/big_modeling.hpp>

#include <c10/util/intrusive_ptr.h>
#include <torch/torch.h>

#include <map>
#include <mutex>

#include "offload/unit_stream.hpp"

namespace hasten {

namespace {

thread_local int t_empty_weights = 0;

// The emptied tensors' shapes, by TensorImpl. The weak reference keeps the TensorImpl's memory
// (so its address is not reused while the entry lives) but not the tensor: an entry whose
// tensor is gone is purged at the next build.
struct Emptied {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> tensor;
  std::vector<int64_t> shape;
};
std::mutex g_mutex;
std::map<const c10::TensorImpl*, Emptied>& emptied() {
  static std::map<const c10::TensorImpl*, Emptied> m;
  return m;
}

}  // namespace

EmptyWeights::EmptyWeights() { ++t_empty_weights; }
EmptyWeights::~EmptyWeights() { --t_empty_weights; }

namespace detail {

bool empty_weights_active() { return t_empty_weights > 0; }

void empty_unit_weights(torch::nn::Module& unit) {
  torch::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& m = emptied();
  for (auto it = m.begin(); it != m.end();) it = it->second.tensor.expired() ? m.erase(it) : std::next(it);
  auto drop = [&](torch::Tensor& t) {
    if (t.numel() == 0 && m.count(t.unsafeGetTensorImpl())) return;  // a nested unit's, emptied already
    m.erase(t.unsafeGetTensorImpl());
    m.emplace(t.unsafeGetTensorImpl(),
              Emptied{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()),
                      t.sizes().vec()});
    t.set_data(torch::empty({0}, t.options()));
  };
  for (auto& p : unit.parameters()) drop(p);
  for (auto& b : unit.buffers()) drop(b);
  release_freed_memory();
}

std::vector<int64_t> declared_shape(const torch::Tensor& t) {
  if (t.numel() == 0) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = emptied().find(t.unsafeGetTensorImpl());
    if (it != emptied().end() && it->second.tensor.lock().get() == t.unsafeGetTensorImpl()) return it->second.shape;
  }
  return t.sizes().vec();
}

}  // namespace detail

}  // namespace hasten
