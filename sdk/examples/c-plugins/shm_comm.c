/*
 * Comm backend "c_shm", a plain-C example: CPU collectives between the processes of one
 * machine through POSIX shared memory. Small rather than fast; the first-party `shm` plugin
 * is the fast one.
 *
 * Each rank owns a segment: a control block with two counters, then a data buffer of
 * `buffer_mb`. Every rank maps every rank's segment (names exchanged through the host's
 * rendezvous store). A collective moves its buffer in chunks that fit; for each chunk, with
 * the operation's sequence number `id`:
 *   1. each rank copies its input into its data buffer and sets `posted` = id;
 *   2. once every rank has posted, each rank reads what it needs from the others' buffers
 *      (allreduce reduces every rank's chunk in rank order, so that each rank computes the
 *      same bits) and sets `done` = id;
 *   3. once every rank is done, nobody reads the buffers any more and the next chunk may
 *      overwrite them.
 * Waits check a deadline, whether the peer process still lives, and abort(): a dead peer is
 * HASTEN_ERR_REMOTE and a hung one HASTEN_ERR_TIMEOUT, never a hang. Every operation
 * completes before it returns (its work is NULL). shm_connect.c connects the ranks at init().
 * C11 for <stdatomic.h>; links neither LibTorch nor hasten.
 */
#define _POSIX_C_SOURCE 200809L

#include "shm_comm.h"

#include <hasten/plugin_error.h>
#include <hasten/plugin_options.h>

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "shm_reduce.h"

static const hasten_option_spec options[] = {
    HASTEN_OPTION_SPEC_RANGE("buffer_mb", HASTEN_OPTION_FLOAT, "4",
                             "MiB of shared memory per rank; larger collectives go in chunks", 0.001, 1024),
};

static int64_t deadline_of(const c_shm* c, const hasten_coll_options* o) {
  return now_ms() + (o != NULL && o->timeout_ms > 0 ? o->timeout_ms : c->timeout_ms);
}

/* ---- create, destroy ---- */

static void shm_destroy(hasten_instance* self) {
  c_shm* c = (c_shm*)self;
  if (c == NULL) return;
  c_shm_disconnect(c);
  pthread_mutex_destroy(&c->mutex);
  free(c->segments);
  free(c->prefix);
  free(c);
}

static hasten_status shm_create(const hasten_host_api* host, const char* options_json, hasten_instance** out) {
  hasten_options o;
  double mb = 4;
  c_shm* c;
  hasten_status s = hasten_options_open(&o, host, PLUGIN, options_json, options, HASTEN_COUNT_OF(options));
  if (s == HASTEN_OK) s = hasten_options_double(&o, "buffer_mb", 4, &mb);
  if (s != HASTEN_OK) return s;
  c = (c_shm*)calloc(1, sizeof *c);
  if (c == NULL) return hasten_fail(host, HASTEN_ERR_SYSTEM, PLUGIN ": out of memory");
  c->host = host;
  /* Whole cache lines, and room for one element of the widest type. */
  c->capacity = (size_t)(mb * 1024 * 1024) / 64 * 64;
  if (c->capacity < 64) c->capacity = 64;
  c->world = 1;
  pthread_mutex_init(&c->mutex, NULL);
  atomic_init(&c->aborted, 0);
  *out = (hasten_instance*)c;
  return HASTEN_OK;
}

static hasten_status shm_init(hasten_instance* self, const hasten_comm_init* init) {
  return c_shm_connect((c_shm*)self, init);
}

static int32_t shm_supports_device(hasten_instance* self, int32_t device_type) {
  (void)self;
  return device_type == kDLCPU;
}

/* ---- waiting on peers ---- */

static hasten_status publish_and_wait(c_shm* c, int done_phase, unsigned long long id, int64_t deadline,
                                      int only_rank, const char* op) {
  int q;
  atomic_store(done_phase ? &control_of(c, c->rank)->done : &control_of(c, c->rank)->posted, id);
  for (q = 0; q < c->world; ++q) {
    control_block* peer = control_of(c, q);
    atomic_ullong* counter = done_phase ? &peer->done : &peer->posted;
    unsigned long spins;
    if (q == c->rank || (only_rank >= 0 && q != only_rank)) continue;
    for (spins = 0; atomic_load(counter) < id; ++spins) {
      if (spins < 1024) continue;
      sched_yield();
      if (spins % 256 != 0) continue;
      if (atomic_load(&c->aborted))
        return hasten_fail(c->host, HASTEN_ERR_INVALID_USAGE, PLUGIN ": %s on rank %d: the communicator was aborted", op, c->rank);
      /* A peer that posted its last counter and exited is not a failure: look again after
       * learning that it is gone. */
      if (kill(atomic_load(&peer->pid), 0) != 0 && errno == ESRCH && atomic_load(counter) < id)
        return hasten_fail(c->host, HASTEN_ERR_REMOTE, PLUGIN ": rank %d died during %s (rank %d was waiting)", q, op, c->rank);
      if (now_ms() > deadline)
        return hasten_fail(c->host, HASTEN_ERR_TIMEOUT, PLUGIN ": %s timed out on rank %d: rank %d did not arrive", op,
                           c->rank, q);
    }
  }
  return HASTEN_OK;
}

/* Phase 1: my input is in my buffer; wait for every rank's (or for only_rank's). */
static hasten_status posted(c_shm* c, unsigned long long id, int64_t deadline, int only_rank, const char* op) {
  return publish_and_wait(c, 0, id, deadline, only_rank, op);
}
/* Phase 3: I am done reading; wait until everybody is, so that the buffers may be reused. */
static hasten_status done(c_shm* c, unsigned long long id, int64_t deadline, const char* op) {
  return publish_and_wait(c, 1, id, deadline, -1, op);
}

/* ---- checking buffers ---- */

static size_t elements(const DLTensor* t) {
  size_t n = 1;
  int i;
  for (i = 0; i < t->ndim; ++i) n *= (size_t)t->shape[i];
  return n;
}
static size_t element_size(const DLTensor* t) { return ((size_t)t->dtype.bits * t->dtype.lanes + 7) / 8; }
static char* bytes_of(const DLTensor* t) { return (char*)t->data + t->byte_offset; }

/* CPU buffers laid out compactly (strides NULL or row-major); anything else is refused. */
static hasten_status check_buffer(const c_shm* c, const DLTensor* t, const char* op) {
  int64_t expected = 1;
  int i;
  if (t->device.device_type != kDLCPU)
    return hasten_fail(c->host, HASTEN_ERR_UNSUPPORTED, PLUGIN " %s: only CPU buffers (got device type %d)", op,
                       (int)t->device.device_type);
  for (i = t->ndim - 1; t->strides != NULL && i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expected)
      return hasten_fail(c->host, HASTEN_ERR_INVALID_ARGUMENT, PLUGIN " %s: buffers must be contiguous", op);
    expected *= t->shape[i];
  }
  return HASTEN_OK;
}

/* ---- collectives ---- */

static hasten_status run_allreduce(c_shm* c, DLTensor* buffer, int32_t op, const hasten_coll_options* o) {
  const size_t es = element_size(buffer), n = elements(buffer);
  const int64_t deadline = deadline_of(c, o);
  char* buf = bytes_of(buffer);
  shm_reducer r;
  size_t start, per_chunk;
  hasten_status s = check_buffer(c, buffer, "allreduce");
  if (s != HASTEN_OK) return s;
  if (op < HASTEN_REDUCE_SUM || op > HASTEN_REDUCE_MAX)
    return hasten_fail(c->host, HASTEN_ERR_INVALID_ARGUMENT, PLUGIN " allreduce: unknown reduce op %d", (int)op);
  if (!shm_reducer_for(buffer->dtype, &r))
    return hasten_fail(c->host, HASTEN_ERR_UNSUPPORTED,
                       PLUGIN " allreduce: dtype code %d, %d bits x %d lanes is not one it handles (float32, float64, "
                              "float16, bfloat16, int32, int64)",
                       (int)buffer->dtype.code, (int)buffer->dtype.bits, (int)buffer->dtype.lanes);
  if (c->world == 1) return HASTEN_OK; /* the average of one is itself */
  per_chunk = c->capacity / es; /* es > 0: the dtype is one of those above */
  for (start = 0; start < n; start += per_chunk) {
    const size_t count = n - start < per_chunk ? n - start : per_chunk;
    const unsigned long long id = ++c->op;
    char* out = buf + start * es;
    int q;
    memcpy(data_of_rank(c, c->rank), out, count * es);
    if ((s = posted(c, id, deadline, -1, "allreduce")) != HASTEN_OK) return s;
    /* Rank order on every rank: the same additions in the same order give the same bits. */
    memcpy(out, data_of_rank(c, 0), count * es);
    for (q = 1; q < c->world; ++q) r.combine(out, data_of_rank(c, q), count, op);
    if (op == HASTEN_REDUCE_AVG) r.divide(out, count, c->world);
    if ((s = done(c, id, deadline, "allreduce")) != HASTEN_OK) return s;
  }
  return HASTEN_OK;
}

static hasten_status run_allgather(c_shm* c, const DLTensor* input, DLTensor* output, const hasten_coll_options* o) {
  const size_t bytes = elements(input) * element_size(input);
  const int64_t deadline = deadline_of(c, o);
  const char* in = bytes_of(input);
  char* out = bytes_of(output);
  size_t start;
  hasten_status s;
  if ((s = check_buffer(c, input, "allgather")) != HASTEN_OK || (s = check_buffer(c, output, "allgather")) != HASTEN_OK)
    return s;
  if (elements(output) * element_size(output) != bytes * (size_t)c->world)
    return hasten_fail(c->host, HASTEN_ERR_INVALID_ARGUMENT, PLUGIN " allgather: output must hold world_size x input bytes");
  if (c->world == 1) {
    if (out != in) memmove(out, in, bytes);
    return HASTEN_OK;
  }
  for (start = 0; start < bytes; start += c->capacity) {
    const size_t count = bytes - start < c->capacity ? bytes - start : c->capacity;
    const unsigned long long id = ++c->op;
    int q;
    memcpy(data_of_rank(c, c->rank), in + start, count);
    if ((s = posted(c, id, deadline, -1, "allgather")) != HASTEN_OK) return s;
    for (q = 0; q < c->world; ++q) memcpy(out + (size_t)q * bytes + start, data_of_rank(c, q), count);
    if ((s = done(c, id, deadline, "allgather")) != HASTEN_OK) return s;
  }
  return HASTEN_OK;
}

static hasten_status run_broadcast(c_shm* c, DLTensor* buffer, int32_t root, const hasten_coll_options* o) {
  const size_t bytes = elements(buffer) * element_size(buffer);
  const int64_t deadline = deadline_of(c, o);
  char* buf = bytes_of(buffer);
  size_t start;
  hasten_status s = check_buffer(c, buffer, "broadcast");
  if (s != HASTEN_OK) return s;
  if (root < 0 || root >= c->world)
    return hasten_fail(c->host, HASTEN_ERR_INVALID_ARGUMENT, PLUGIN " broadcast: root %d outside [0, %d)", (int)root, c->world);
  if (c->world == 1) return HASTEN_OK;
  for (start = 0; start < bytes; start += c->capacity) {
    const size_t count = bytes - start < c->capacity ? bytes - start : c->capacity;
    const unsigned long long id = ++c->op;
    if (c->rank == root) memcpy(data_of_rank(c, root), buf + start, count);
    if ((s = posted(c, id, deadline, root, "broadcast")) != HASTEN_OK) return s;
    if (c->rank != root) memcpy(buf + start, data_of_rank(c, root), count);
    if ((s = done(c, id, deadline, "broadcast")) != HASTEN_OK) return s;
  }
  return HASTEN_OK;
}

static hasten_status run_barrier(c_shm* c, const hasten_coll_options* o) {
  /* No buffer is read, so nobody need wait for the others to be done with it. */
  const unsigned long long id = ++c->op;
  hasten_status s;
  if (c->world == 1) return HASTEN_OK;
  s = posted(c, id, deadline_of(c, o), -1, "barrier");
  atomic_store(&control_of(c, c->rank)->done, id);
  return s;
}

/* The slots: one collective at a time, each complete before it returns (work NULL). */

static hasten_status shm_allreduce(hasten_instance* self, DLTensor* buffer, int32_t op, const hasten_coll_options* o,
                                   hasten_work** work) {
  c_shm* c = (c_shm*)self;
  hasten_status s;
  pthread_mutex_lock(&c->mutex);
  s = run_allreduce(c, buffer, op, o);
  pthread_mutex_unlock(&c->mutex);
  if (work != NULL) *work = NULL;
  return s;
}

static hasten_status shm_allgather(hasten_instance* self, const DLTensor* input, DLTensor* output,
                                   const hasten_coll_options* o, hasten_work** work) {
  c_shm* c = (c_shm*)self;
  hasten_status s;
  pthread_mutex_lock(&c->mutex);
  s = run_allgather(c, input, output, o);
  pthread_mutex_unlock(&c->mutex);
  if (work != NULL) *work = NULL;
  return s;
}

static hasten_status shm_broadcast(hasten_instance* self, DLTensor* buffer, int32_t root, const hasten_coll_options* o,
                                   hasten_work** work) {
  c_shm* c = (c_shm*)self;
  hasten_status s;
  pthread_mutex_lock(&c->mutex);
  s = run_broadcast(c, buffer, root, o);
  pthread_mutex_unlock(&c->mutex);
  if (work != NULL) *work = NULL;
  return s;
}

static hasten_status shm_barrier(hasten_instance* self, const hasten_coll_options* o, hasten_work** work) {
  c_shm* c = (c_shm*)self;
  hasten_status s;
  pthread_mutex_lock(&c->mutex);
  s = run_barrier(c, o);
  pthread_mutex_unlock(&c->mutex);
  if (work != NULL) *work = NULL;
  return s;
}

/* Every operation returned a NULL work: there is never one to wait on or free. */
static hasten_status shm_work_wait(hasten_instance* self, hasten_work* work, int64_t timeout_ms) {
  (void)self, (void)work, (void)timeout_ms;
  return HASTEN_OK;
}
static void shm_work_free(hasten_instance* self, hasten_work* work) { (void)self, (void)work; }

/* From any thread: the waits above see the flag and fail. */
static void shm_abort(hasten_instance* self) { atomic_store(&((c_shm*)self)->aborted, 1); }

/* CPU buffers of ranks on one machine, at a priority below every first-party backend: under
 * `comm: auto` it is picked only where none of those is installed; the config can name it. */
static const int32_t devices[] = {kDLCPU};
static const hasten_comm_serves serves = {
    .struct_size = sizeof(hasten_comm_serves),
    .abi_version = HASTEN_ABI_VERSION,
    .device_types = devices,
    .n_device_types = 1,
    .scope = HASTEN_COMM_SCOPE_ONE_MACHINE,
    .priority = 1,
};

/* reduce_scatter and work_test are left NULL: the host then uses allreduce plus a slice, and
 * learns of completion through work_wait. */
static const hasten_comm_vtable vtable = {
    .struct_size = sizeof(hasten_comm_vtable),
    .abi_version = HASTEN_ABI_VERSION,
    .create = shm_create,
    .destroy = shm_destroy,
    .init = shm_init,
    .supports_device = shm_supports_device,
    .allreduce = shm_allreduce,
    .allgather = shm_allgather,
    .broadcast = shm_broadcast,
    .barrier = shm_barrier,
    .work_wait = shm_work_wait,
    .work_free = shm_work_free,
    .abort = shm_abort,
    .serves = &serves,
};

static const hasten_plugin_descriptor descriptor = {
    .struct_size = sizeof(hasten_plugin_descriptor),
    .abi_version = HASTEN_ABI_VERSION,
    .kind = HASTEN_KIND_COMM,
    .name = PLUGIN,
    .version = "1.0",
    .description = "CPU collectives through POSIX shared memory, ranks of one machine (plain-C example)",
    .vtable = &vtable,
    .options = options,
    .n_options = HASTEN_COUNT_OF(options),
};

static const hasten_plugin_descriptor* const plugins[] = {&descriptor};

HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t host_abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  if (HASTEN_ABI_VERSION_MAJOR(host_abi) != HASTEN_ABI_MAJOR)
    return hasten_fail(host, HASTEN_ERR_UNSUPPORTED, PLUGIN " speaks plugin ABI major %d", HASTEN_ABI_MAJOR);
  *out = plugins;
  *count = 1;
  return HASTEN_OK;
}
