// hasten::Work: the handle of an asynchronous collective (Accelerator::all_reduce_).
#pragma once

#include <memory>
#include <utility>

namespace hasten {

namespace detail {
struct PendingWork;
}  // namespace detail

// An asynchronous collective. wait() blocks until it completes and throws hasten::Error if it
// failed (a dead or hung peer, a timeout). On CUDA tensors whose backend has work_wait_stream
// (nccl), wait() instead makes LibTorch's current stream wait for the collective and returns
// without blocking the host: a failure already known is thrown; a later one, or a timeout,
// aborts the communicator (the plugin's watchdog) and fails every later CUDA collective.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::PendingWork> pending) : pending_(std::move(pending)) {}
  void wait();
  bool is_completed();

 private:
  std::shared_ptr<detail::PendingWork> pending_;
};

}  // namespace hasten
