// The one place where LibTorch version differences are handled; no other file tests
// TORCH_VERSION_*. hasten supports LibTorch 2.11 to 2.15 (README); what differs from one
// LibTorch to another goes through here, so that a new release changes this file alone.
#ifndef HASTEN_TORCH_COMPAT_HPP
#define HASTEN_TORCH_COMPAT_HPP

#include <ATen/autocast_mode.h>
#include <c10/core/Stream.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <memory>
#include <type_traits>

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 11)
#error "hasten needs LibTorch 2.11 or newer (c10::Stream::native_handle, the device-type autocast API)"
#endif

namespace hasten::compat {

inline bool autocast_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
inline void set_autocast_enabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
inline at::ScalarType autocast_dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
inline void set_autocast_dtype(c10::DeviceType d, at::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }

// Zeroes gradients in place (2.x defaults to set_to_none, which would drop gradient
// buffers a strategy aliased).
inline void zero_grad_in_place(torch::optim::Optimizer& optimizer) { optimizer.zero_grad(false); }

// How autograd hands out a node (the AccumulateGrad of a leaf): the pointer type changed across
// releases, so it is named by what grad_accumulator returns.
using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

// A reference to a node that does not keep it alive: weak_ptr for a shared_ptr, weak_intrusive_ptr
// for an intrusive_ptr. Both have expired() and lock(); make one with WeakNodePtr(node).
template <class P>
struct WeakOf;
template <class T>
struct WeakOf<std::shared_ptr<T>> {
  using type = std::weak_ptr<T>;
};
template <class T>
struct WeakOf<c10::intrusive_ptr<T>> {
  using type = c10::weak_intrusive_ptr<T>;
};
using WeakNodePtr = typename WeakOf<std::decay_t<NodePtr>>::type;

// The key of a parameter's entry in Optimizer::state(): the parameter's TensorImpl (LibTorch's
// own optimizers look their state up the same way).
inline void* state_key(const at::Tensor& param) { return param.unsafeGetTensorImpl(); }

// The backend's handle of a stream (a cudaStream_t for CUDA), for plugins that take a raw
// stream: c10::Stream::native_handle (2.11 on).
inline void* native_stream_handle(const c10::Stream& stream) { return stream.native_handle(); }

}  // namespace hasten::compat

#endif  // HASTEN_TORCH_COMPAT_HPP
