/*
 * Connecting the ranks of the c_shm example (shm_comm.c has the collectives). Rank 0 names
 * the run's segments and publishes the name in the host's rendezvous store; each rank creates
 * its own segment, and once every rank has, maps everyone's. The names are removed as soon as
 * every rank has mapped them, so the memory goes with the last process, however it ends.
 */
#define _POSIX_C_SOURCE 200809L

#include "shm_comm.h"

#include <hasten/plugin_error.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static hasten_status store_failed(const c_shm* c, hasten_status s, const char* what) {
  const char* m = c->host->last_error(c->host);
  char copy[512];
  snprintf(copy, sizeof copy, "%s", m != NULL ? m : "");
  return hasten_fail(c->host, s, PLUGIN ": rendezvous (%s) failed: %s", what, copy);
}

static void key_of(const c_shm* c, const char* what, char* key, size_t size) { snprintf(key, size, "%s%s", c->prefix, what); }

/* Counts this rank in under `what` and waits until every rank has. */
static hasten_status arrive(c_shm* c, const char* what) {
  char key[512];
  int64_t n = 0;
  const int64_t deadline = now_ms() + c->timeout_ms;
  const struct timespec ms = {0, 1000000};
  hasten_status s;
  key_of(c, what, key, sizeof key);
  if ((s = c->host->store_add(c->host, key, 1, &n)) != HASTEN_OK) return store_failed(c, s, what);
  while (n < c->world) {
    if (now_ms() > deadline)
      return hasten_fail(c->host, HASTEN_ERR_TIMEOUT, PLUGIN ": set-up timed out waiting for the other ranks (%s)", what);
    nanosleep(&ms, NULL);
    if ((s = c->host->store_add(c->host, key, 0, &n)) != HASTEN_OK) return store_failed(c, s, what);
  }
  return HASTEN_OK;
}

/* Rank 0 names the run's segments; every rank learns the name. */
static hasten_status agree_on_token(c_shm* c, char* token, size_t size) {
  char key[512];
  size_t got = 0;
  hasten_status s;
  key_of(c, "token", key, sizeof key);
  if (c->rank == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(token, size, "/hasten-c_shm-%ld-%ld", (long)getpid(), (long)ts.tv_nsec);
    s = c->host->store_set(c->host, key, token, strlen(token) + 1);
  } else {
    s = c->host->store_get(c->host, key, token, size, &got, c->timeout_ms);
  }
  return s == HASTEN_OK ? HASTEN_OK : store_failed(c, s, "token");
}

static hasten_status map_segment(c_shm* c, int q, const char* name, int create) {
  const size_t size = CONTROL_BYTES + c->capacity;
  int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  int err;
  if (fd < 0)
    return hasten_fail(c->host, HASTEN_ERR_SYSTEM, PLUGIN ": rank %d cannot %s segment %s (are all ranks on one machine?): %s",
                       c->rank, create ? "create" : "open", name, strerror(errno));
  /* Reserve the pages now: a /dev/shm too small fails here with a message, not with SIGBUS
   * in the middle of a collective. */
  if (create && (ftruncate(fd, (off_t)size) != 0 || (errno = posix_fallocate(fd, 0, (off_t)size)) != 0)) {
    err = errno;
    close(fd);
    return hasten_fail(c->host, HASTEN_ERR_SYSTEM, PLUGIN ": cannot reserve %zu bytes in /dev/shm: %s (lower buffer_mb)",
                       size, strerror(err));
  }
  c->segments[q] = (char*)mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  err = errno;
  close(fd);
  if (c->segments[q] == (char*)MAP_FAILED) {
    c->segments[q] = NULL;
    return hasten_fail(c->host, HASTEN_ERR_SYSTEM, PLUGIN ": cannot map %s: %s", name, strerror(err));
  }
  return HASTEN_OK;
}

hasten_status c_shm_connect(c_shm* c, const hasten_comm_init* init) {
  hasten_process_info info;
  char token[96], peer[128];
  control_block* mine;
  hasten_status s;
  int q;
  c->rank = init->rank;
  c->world = init->world_size;
  c->timeout_ms = init->timeout_ms > 0 ? init->timeout_ms : 1800000;
  c->prefix = strdup(init->store_prefix != NULL ? init->store_prefix : PLUGIN "/");
  c->segments = (char**)calloc((size_t)c->world, sizeof(char*));
  if (c->prefix == NULL || c->segments == NULL) return hasten_fail(c->host, HASTEN_ERR_SYSTEM, PLUGIN ": out of memory");
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  if ((s = c->host->process_info(c->host, &info)) != HASTEN_OK) return s;
  if (info.num_nodes > 1)
    return hasten_fail(c->host, HASTEN_ERR_UNSUPPORTED,
                       PLUGIN ": the run spans %d machines; shared memory connects the ranks of one machine", info.num_nodes);
  if (c->world == 1) return HASTEN_OK; /* nobody to connect to: every collective is local */
  if ((s = agree_on_token(c, token, sizeof token)) != HASTEN_OK) return s;
  snprintf(c->name, sizeof c->name, "%s-%d", token, c->rank);
  if ((s = map_segment(c, c->rank, c->name, 1)) != HASTEN_OK) {
    shm_unlink(c->name);
    c->name[0] = '\0';
    return s;
  }
  mine = control_of(c, c->rank);
  atomic_store(&mine->posted, 0);
  atomic_store(&mine->done, 0);
  mine->capacity = c->capacity;
  atomic_store(&mine->pid, (int)getpid());
  if ((s = arrive(c, "created")) != HASTEN_OK) return s;
  for (q = 0; q < c->world; ++q) {
    if (q == c->rank) continue;
    snprintf(peer, sizeof peer, "%s-%d", token, q);
    if ((s = map_segment(c, q, peer, 0)) != HASTEN_OK) return s;
    if (control_of(c, q)->capacity != c->capacity)
      return hasten_fail(c->host, HASTEN_ERR_INVALID_ARGUMENT, PLUGIN ": ranks %d and %d disagree on buffer_mb", c->rank, q);
  }
  if ((s = arrive(c, "mapped")) != HASTEN_OK) return s;
  /* Everyone has it mapped: the memory goes when the last rank exits, however it exits. */
  shm_unlink(c->name);
  c->unlinked = 1;
  c->host->log(c->host, HASTEN_LOG_INFO, PLUGIN, PLUGIN ": connected every rank through shared memory");
  return HASTEN_OK;
}

void c_shm_disconnect(c_shm* c) {
  int q;
  for (q = 0; c->segments != NULL && q < c->world; ++q)
    if (c->segments[q] != NULL) munmap(c->segments[q], CONTROL_BYTES + c->capacity);
  if (c->name[0] != '\0' && !c->unlinked) shm_unlink(c->name);
}
