// The CUDA side of the nccl plugin's operations: the device a call runs on, the events that
// order streams, and a collective's work item (the communicator and its watchdog, in
// nccl_comm.cpp, own them).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <new>
#include <vector>

#include "nccl_support.hpp"

namespace hasten::nccl {

using Clock = std::chrono::steady_clock;

// Makes `device` current on this thread for the scope and restores the previous device after.
// Operations may come from any thread (autograd threads, a thread waiting on work), and the
// legacy default stream and new events belong to the current device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ == device)
      previous_ = -1;
    else
      cuda_check(cudaSetDevice(device), "cudaSetDevice");
  }
  // For paths that cannot report a failure: does what it can.
  DeviceGuard(int device, std::nothrow_t) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess || previous_ == device || cudaSetDevice(device) != cudaSuccess)
      previous_ = -1;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Reusable events of the communicator's device, created with cudaEventDisableTiming (no
// timestamps: the cheapest kind to record and wait on). acquire() runs on that device.
class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (cudaEvent_t e : all_) (void)cudaEventDestroy(e);
  }
  cudaEvent_t acquire() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    // Room first, so that neither the push below nor any release() can fail to allocate.
    all_.reserve(all_.size() + 1);
    free_.reserve(all_.size() + 1);
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    all_.push_back(e);
    return e;
  }
  void release(cudaEvent_t e) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(e);  // capacity for every event created was reserved in acquire()
  }

 private:
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_, all_;
};

// An event of the pool for a scope: back to the pool at its end unless release()d.
class PooledEvent {
 public:
  explicit PooledEvent(EventPool& pool) : pool_(pool), event_(pool.acquire()) {}
  ~PooledEvent() {
    if (event_ != nullptr) pool_.release(event_);
  }
  PooledEvent(const PooledEvent&) = delete;
  PooledEvent& operator=(const PooledEvent&) = delete;
  cudaEvent_t get() const { return event_; }
  cudaEvent_t release() {
    cudaEvent_t e = event_;
    event_ = nullptr;
    return e;
  }

 private:
  EventPool& pool_;
  cudaEvent_t event_;
};

struct Work {
  const char* op = "";             // static: "allreduce"...
  cudaEvent_t done = nullptr;      // recorded on the comm stream after the collective; pooled
  bool on_default_stream = false;  // the caller's stream was the legacy default stream
  int64_t timeout_ms = 0;          // the work's deadline: its options' timeout, else init's
  Clock::time_point issued;
  std::atomic<bool> completed{false};  // the host saw `done` complete
  std::atomic<bool> ordered{false};    // the legacy default stream was made to wait for `done`
  // Guarded by NcclComm::watch_mutex_.
  bool watched = false;   // made stream-ordered, not yet seen complete: in the watchdog's list
  bool orphaned = false;  // freed by its owner while watched: the watchdog releases it
};

}  // namespace hasten::nccl
