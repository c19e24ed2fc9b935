// Tensors over a range of a flat storage, as the sharding engine lays out units: parameters
// re-pointed into a unit's flat buffer (rebind) and fresh tensors over a range of it (alias).
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace hasten::sharded {

inline std::vector<int64_t> shape_strides(at::IntArrayRef shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    strides[static_cast<size_t>(i)] = strides[static_cast<size_t>(i + 1)] * shape[static_cast<size_t>(i + 1)];
  return strides;
}

// Points t at [offset, offset + numel(shape)) of flat's storage, without bumping its version
// counter: tensors autograd saved from t share the counter, and re-pointing is not a change
// of their values (the storage is refilled with the same values by a gather).
inline void rebind(torch::Tensor& t, const torch::Tensor& flat, int64_t offset, at::IntArrayRef shape) {
  at::AutoDispatchBelowADInplaceOrView guard;
  t.set_(flat.storage(), flat.storage_offset() + offset, shape, shape_strides(shape));
}

// A fresh tensor over [offset, offset + numel(shape)) of flat (not an autograd view).
inline torch::Tensor alias(const torch::Tensor& flat, int64_t offset, at::IntArrayRef shape) {
  torch::NoGradGuard no_grad;
  auto t = torch::empty({0}, flat.options().requires_grad(false));
  t.set_(flat.storage(), flat.storage_offset() + offset, shape, shape_strides(shape));
  return t;
}

}  // namespace hasten::sharded
