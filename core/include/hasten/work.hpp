// hasten::Work: the handle of an asynchronous collective (Accelerator::all_reduce_).
#pragma once

#include <memory>
#include <utility>

namespace hasten {

namespace detail {
struct PendingWork;
}  // namespace detail

// An asynchronous collective: wait() blocks until it completes and throws hasten::Error if
// it failed (a dead or hung peer, a timeout).
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
