#include "plugins/host_api.hpp"

#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/version.hpp>

#include <cstddef>
#include <cstring>

#include "comm/communicator.hpp"
#include "comm/process_groups.hpp"
#include "plugins/host_options.hpp"

namespace hasten::detail {

namespace {

thread_local std::string t_plugin_error;
thread_local bool t_plugin_error_set = false;

LogLevel to_log_level(int32_t level) {
  switch (level) {
    case HASTEN_LOG_TRACE: return LogLevel::trace;
    case HASTEN_LOG_DEBUG: return LogLevel::debug;
    case HASTEN_LOG_INFO: return LogLevel::info;
    case HASTEN_LOG_WARN: return LogLevel::warn;
    default: return LogLevel::error;
  }
}

// Every host function is noexcept at the boundary: a C++ exception must not reach the plugin.
template <class Fn>
hasten_status host_guard(Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::exception& e) {
    t_plugin_error = e.what();
    t_plugin_error_set = true;
    return HASTEN_ERR_INTERNAL;
  } catch (...) {
    t_plugin_error = "unknown exception in the host";
    t_plugin_error_set = true;
    return HASTEN_ERR_INTERNAL;
  }
}

hasten_status fail(hasten_status status, const std::string& message) {
  t_plugin_error = message;
  t_plugin_error_set = true;
  return status;
}

void host_log(const hasten_host_api*, int32_t level, const char* plugin,
              const char* message) noexcept {
  try {
    static auto logger = get_logger("hasten");
    logger->log(to_log_level(level), "[{}] {}", plugin ? plugin : "plugin", message ? message : "");
  } catch (...) {
  }
}

void host_set_error(const hasten_host_api*, const char* message) noexcept {
  try {
    t_plugin_error = message != nullptr ? message : "";
    t_plugin_error_set = true;
  } catch (...) {
  }
}

hasten_status host_process_info(const hasten_host_api* api, hasten_process_info* out) noexcept {
  if (out == nullptr) return fail(HASTEN_ERR_INVALID_ARGUMENT, "process_info: out is NULL");
  const HostContext& ctx = HostContext::from(api);
  hasten_process_info info{};
  info.struct_size = sizeof(info);
  info.abi_version = HASTEN_ABI_VERSION;
  info.rank = ctx.process.rank;
  info.world_size = ctx.process.world_size;
  info.local_rank = ctx.process.local_rank;
  info.local_world_size = ctx.process.local_world_size;
  info.node_rank = ctx.process.node_rank;
  info.num_nodes = ctx.process.num_nodes;
  info.timeout_ms = ctx.timeout_ms;
  // Copy no more than the caller's struct holds (it may be an older, shorter one).
  const size_t n = out->struct_size != 0 && out->struct_size < sizeof(info) ? out->struct_size
                                                                            : sizeof(info);
  std::memcpy(out, &info, n);
  out->struct_size = static_cast<uint32_t>(n);
  return HASTEN_OK;
}

hasten_status host_store_set(const hasten_host_api* api, const char* key, const void* data,
                             size_t size) noexcept {
  return host_guard([&]() -> hasten_status {
    Store* store = HostContext::from(api).store;
    if (store == nullptr) return fail(HASTEN_ERR_UNSUPPORTED, "this run has no rendezvous store");
    auto* p = static_cast<const uint8_t*>(data);
    store->set(key, std::vector<uint8_t>(p, p + size));
    return HASTEN_OK;
  });
}

hasten_status host_store_get(const hasten_host_api* api, const char* key, void* buffer,
                             size_t capacity, size_t* size, int64_t timeout_ms) noexcept {
  return host_guard([&]() -> hasten_status {
    Store* store = HostContext::from(api).store;
    if (store == nullptr) return fail(HASTEN_ERR_UNSUPPORTED, "this run has no rendezvous store");
    auto value = store->get(key, timeout_ms);
    if (size != nullptr) *size = value.size();
    if (value.size() > capacity)
      return fail(HASTEN_ERR_INVALID_ARGUMENT, "store_get: value of '" + std::string(key) +
                                                   "' needs " + std::to_string(value.size()) +
                                                   " bytes");
    if (!value.empty()) std::memcpy(buffer, value.data(), value.size());
    return HASTEN_OK;
  });
}

hasten_status host_store_add(const hasten_host_api* api, const char* key, int64_t delta,
                             int64_t* result) noexcept {
  return host_guard([&]() -> hasten_status {
    Store* store = HostContext::from(api).store;
    if (store == nullptr) return fail(HASTEN_ERR_UNSUPPORTED, "this run has no rendezvous store");
    int64_t v = store->add(key, delta);
    if (result != nullptr) *result = v;
    return HASTEN_OK;
  });
}

// Host work items wrap the communicator's Work.
struct HostWork {
  WorkPtr work;
};

hasten_status publish(WorkPtr work, hasten_work** out) {
  if (out == nullptr) {  // the caller does not want a handle: complete now
    if (work) work->wait(0);
    return HASTEN_OK;
  }
  *out = work ? reinterpret_cast<hasten_work*>(new HostWork{std::move(work)}) : nullptr;
  return HASTEN_OK;
}

Communicator& comm_of(const hasten_host_api* api) {
  Communicator* comm = HostContext::from(api).comm;
  if (comm == nullptr) throw Error("no communicator: collectives are not available here");
  return *comm;
}

// The communicator a host collective runs on: its group's (ABI 1.11, options->group) or the
// world's. A comm plugin never sees the group (its instance is the group's communicator):
// *routed is the caller's options with group cleared, in `storage`.
Communicator& route(const hasten_host_api* api, const hasten_coll_options* options, hasten_coll_options& storage,
                    const hasten_coll_options** routed) {
  *routed = options;
  Communicator& world = comm_of(api);
  // A caller built against a header before 1.11 has a struct that ends before group.
  if (options == nullptr || options->struct_size < offsetof(hasten_coll_options, group) + sizeof(options->group) ||
      options->group == nullptr)
    return world;
  const ProcessGroups* groups = HostContext::from(api).groups;
  if (groups == nullptr || !groups->holds(options->group))
    throw Error("a collective names a group that is not one of this run's (host->group makes them)");
  storage = hasten_coll_options{};
  std::memcpy(&storage, options, sizeof storage);
  storage.struct_size = sizeof storage;  // a newer caller's longer struct is cut to what is copied
  storage.group = nullptr;
  *routed = &storage;
  return *reinterpret_cast<const ProcessGroups::Entry*>(options->group)->comm;
}

hasten_status host_allreduce(const hasten_host_api* api, DLTensor* buffer, int32_t op,
                             const hasten_coll_options* options, hasten_work** work) noexcept {
  return host_guard([&]() -> hasten_status {
    hasten_coll_options storage;
    const hasten_coll_options* o = nullptr;
    Communicator& comm = route(api, options, storage, &o);
    return publish(comm.allreduce(*buffer, static_cast<hasten_reduce_op>(op), o), work);
  });
}

hasten_status host_allgather(const hasten_host_api* api, const DLTensor* input, DLTensor* output,
                             const hasten_coll_options* options, hasten_work** work) noexcept {
  return host_guard([&]() -> hasten_status {
    hasten_coll_options storage;
    const hasten_coll_options* o = nullptr;
    Communicator& comm = route(api, options, storage, &o);
    return publish(comm.allgather(*input, *output, o), work);
  });
}

hasten_status host_reduce_scatter(const hasten_host_api* api, const DLTensor* input,
                                  DLTensor* output, int32_t op,
                                  const hasten_coll_options* options,
                                  hasten_work** work) noexcept {
  return host_guard([&]() -> hasten_status {
    hasten_coll_options storage;
    const hasten_coll_options* o = nullptr;
    Communicator& comm = route(api, options, storage, &o);
    return publish(comm.reduce_scatter(*input, *output, static_cast<hasten_reduce_op>(op), o), work);
  });
}

hasten_status host_broadcast(const hasten_host_api* api, DLTensor* buffer, int32_t root,
                             const hasten_coll_options* options, hasten_work** work) noexcept {
  return host_guard([&]() -> hasten_status {
    hasten_coll_options storage;
    const hasten_coll_options* o = nullptr;
    Communicator& comm = route(api, options, storage, &o);
    return publish(comm.broadcast(*buffer, root, o), work);
  });
}

hasten_status host_barrier(const hasten_host_api* api, const hasten_coll_options* options) noexcept {
  return host_guard([&]() -> hasten_status {
    hasten_coll_options storage;
    const hasten_coll_options* o = nullptr;
    route(api, options, storage, &o).barrier(o);
    return HASTEN_OK;
  });
}

// ABI 1.11: this rank's group along a mesh dimension.
hasten_status host_group(const hasten_host_api* api, const char* name, const hasten_group** out, int32_t* rank,
                         int32_t* size) noexcept {
  return host_guard([&]() -> hasten_status {
    if (name == nullptr || out == nullptr) return fail(HASTEN_ERR_INVALID_ARGUMENT, "group: name or out is NULL");
    const ProcessGroups* groups = HostContext::from(api).groups;
    if (groups == nullptr)
      return fail(HASTEN_ERR_INVALID_USAGE, "group: this context has no device mesh (only a run's plugins have one)");
    const ProcessGroups::Entry* e = groups->find(name);
    if (e == nullptr)
      return fail(HASTEN_ERR_INVALID_ARGUMENT,
                  std::string("group: the device mesh has no group '") + name + "' (allowed: " + groups->names() + ")");
    *out = reinterpret_cast<const hasten_group*>(e);
    if (rank != nullptr) *rank = e->group.rank;
    if (size != nullptr) *size = e->group.size();
    return HASTEN_OK;
  });
}

hasten_status host_work_wait(const hasten_host_api*, hasten_work* work,
                             int64_t timeout_ms) noexcept {
  return host_guard([&]() -> hasten_status {
    if (work != nullptr) reinterpret_cast<HostWork*>(work)->work->wait(timeout_ms);
    return HASTEN_OK;
  });
}

void host_work_free(const hasten_host_api*, hasten_work* work) noexcept {
  auto* w = reinterpret_cast<HostWork*>(work);
  if (w == nullptr) return;
  try {
    if (!w->work->test()) w->work->wait(0);
  } catch (...) {  // the failure was (or will never be) reported through work_wait
  }
  delete w;
}

const char* host_last_error(const hasten_host_api*) noexcept { return t_plugin_error.c_str(); }

}  // namespace

HostContext::HostContext() {
  api.struct_size = sizeof(hasten_host_api);
  api.abi_version = HASTEN_ABI_VERSION;
  api.host_version = hasten::version();
  api.torch_fingerprint = host_torch_fingerprint();
  api.log = &host_log;
  api.set_error = &host_set_error;
  api.process_info = &host_process_info;
  api.store_set = &host_store_set;
  api.store_get = &host_store_get;
  api.store_add = &host_store_add;
  api.allreduce = &host_allreduce;
  api.allgather = &host_allgather;
  api.reduce_scatter = &host_reduce_scatter;
  api.broadcast = &host_broadcast;
  api.barrier = &host_barrier;
  api.work_wait = &host_work_wait;
  api.work_free = &host_work_free;
  api.last_error = &host_last_error;
  api.group = &host_group;
  install_option_lookups(api);
}

const hasten_host_api* registry_host() {
  static HostContext* ctx = new HostContext();  // lives until exit, as plugin libraries do
  return &ctx->api;
}

std::string take_plugin_error(const char* fallback) {
  std::string message = t_plugin_error_set && !t_plugin_error.empty() ? t_plugin_error : fallback;
  t_plugin_error.clear();
  t_plugin_error_set = false;
  return message;
}

hasten_status set_host_error(hasten_status status, const std::string& message) { return fail(status, message); }

void clear_plugin_error() {
  t_plugin_error.clear();
  t_plugin_error_set = false;
}

const char* status_name(hasten_status status) noexcept {
  switch (status) {
    case HASTEN_OK: return "ok";
    case HASTEN_ERR_INVALID_ARGUMENT: return "invalid argument";
    case HASTEN_ERR_INVALID_USAGE: return "invalid usage";
    case HASTEN_ERR_UNSUPPORTED: return "unsupported";
    case HASTEN_ERR_SYSTEM: return "system error";
    case HASTEN_ERR_TIMEOUT: return "timeout";
    case HASTEN_ERR_REMOTE: return "remote failure";
    case HASTEN_ERR_INTERNAL: return "internal error";
    default: return "unknown status";
  }
}

}  // namespace hasten::detail
