// The host's view of a comm plugin instance (C tier).
#pragma once

#include <memory>
#include <string>

#include "plugins/plugin_instances.hpp"

namespace hasten::detail {

class CommInstance : public PluginInstance {
 public:
  using PluginInstance::PluginInstance;

  // device_id: for a CUDA backend, the CUDA ordinal the host picked for this rank and made
  // current on this thread; -1: none (CPU backends).
  void init(int rank, int world_size, int64_t timeout_ms, int64_t connect_timeout_ms, const std::string& store_prefix,
            int32_t device_id = -1) {
    hasten_comm_init init{};
    init.struct_size = sizeof(init);
    init.abi_version = HASTEN_ABI_VERSION;
    init.rank = rank;
    init.world_size = world_size;
    init.timeout_ms = timeout_ms;
    init.store_prefix = store_prefix.c_str();
    init.connect_timeout_ms = connect_timeout_ms;
    init.device_id = device_id;
    call("init", [&] { return vt().comm.init(instance_, &init); });
  }
  bool supports_device(int32_t device_type) const {
    try {
      return vt().comm.supports_device(instance_, device_type) != 0;
    } catch (...) {
      return false;
    }
  }
  hasten_work* allreduce(DLTensor& b, hasten_reduce_op op, const hasten_coll_options* o) {
    hasten_work* w = nullptr;
    call("allreduce", [&] { return vt().comm.allreduce(instance_, &b, op, o, &w); });
    return w;
  }
  hasten_work* allgather(const DLTensor& in, DLTensor& out, const hasten_coll_options* o) {
    hasten_work* w = nullptr;
    call("allgather", [&] { return vt().comm.allgather(instance_, &in, &out, o, &w); });
    return w;
  }
  bool has_reduce_scatter() const { return vt().comm.reduce_scatter != nullptr; }
  hasten_work* reduce_scatter(const DLTensor& in, DLTensor& out, hasten_reduce_op op,
                              const hasten_coll_options* o) {
    hasten_work* w = nullptr;
    call("reduce_scatter", [&] { return vt().comm.reduce_scatter(instance_, &in, &out, op, o, &w); });
    return w;
  }
  hasten_work* broadcast(DLTensor& b, int root, const hasten_coll_options* o) {
    hasten_work* w = nullptr;
    call("broadcast", [&] { return vt().comm.broadcast(instance_, &b, root, o, &w); });
    return w;
  }
  hasten_work* barrier(const hasten_coll_options* o) {
    hasten_work* w = nullptr;
    call("barrier", [&] { return vt().comm.barrier(instance_, o, &w); });
    return w;
  }
  void wait(hasten_work* w, int64_t timeout_ms) {
    call("work_wait", [&] { return vt().comm.work_wait(instance_, w, timeout_ms); });
  }
  // ABI 1.6: the backend can make a stream wait for a work instead of blocking the host
  // (plugin.h, "Stream-ordered waits"). NULL in a 1.0-1.5 plugin (the vtable copy is zeroed
  // past its struct_size).
  bool has_wait_stream() const { return vt().comm.work_wait_stream != nullptr; }
  // Enqueues on `stream` (a cudaStream_t) a wait for w; returns without blocking.
  void wait_stream(hasten_work* w, void* stream) {
    call("work_wait_stream", [&] { return vt().comm.work_wait_stream(instance_, w, stream); });
  }
  bool test(hasten_work* w) {
    if (vt().comm.work_test == nullptr) return false;
    int32_t done = 0;
    call("work_test", [&] { return vt().comm.work_test(instance_, w, &done); });
    return done != 0;
  }
  void free(hasten_work* w) noexcept {
    try {
      vt().comm.work_free(instance_, w);
    } catch (...) {
    }
  }
  // ABI 1.11: process groups. NULL in a plugin built before (the vtable copy is zeroed past its
  // struct_size).
  bool has_split() const { return vt().comm.split != nullptr; }
  // A connected instance of this plugin over the group (plugin.h, comm slot split).
  std::unique_ptr<CommInstance> split(int color, int rank, int size, const std::string& store_prefix) {
    hasten_comm_split s{};
    s.struct_size = sizeof(s);
    s.abi_version = HASTEN_ABI_VERSION;
    s.color = color;
    s.rank = rank;
    s.size = size;
    s.store_prefix = store_prefix.c_str();
    hasten_instance* out = nullptr;
    call("split", [&] { return vt().comm.split(instance_, &s, &out); });
    if (out == nullptr) throw PluginError(label() + ": split returned no instance");
    return std::unique_ptr<CommInstance>(new CommInstance(*this, out));
  }
  void abort() noexcept {
    try {
      if (vt().comm.abort) vt().comm.abort(instance_);
    } catch (...) {
    }
  }

 private:
  // A group's instance, made by the plugin's split: the parent's plugin, adopted.
  CommInstance(const CommInstance& parent, hasten_instance* adopted) : PluginInstance(parent, adopted) {}
};

}  // namespace hasten::detail
