/*
 * What the two files of the c_shm example share: the shared-memory layout and the instance.
 * shm_connect.c connects the ranks (segments named through the host's store), shm_comm.c runs
 * the collectives over them and holds the plugin's slots.
 */
#ifndef C_SHM_COMM_H
#define C_SHM_COMM_H

#include <hasten/plugin.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define PLUGIN "c_shm"
#define CONTROL_BYTES 4096

/* The counters are read by other processes: they must be lock-free atomics. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "shared-memory counters need lock-free 64-bit atomics");

typedef struct {
  atomic_ullong posted; /* id of the last operation whose input this rank published */
  char pad0[64 - sizeof(atomic_ullong)];
  atomic_ullong done; /* id of the last operation whose peers' buffers this rank has read */
  char pad1[64 - sizeof(atomic_ullong)];
  atomic_int pid;
  unsigned long long capacity; /* bytes of the data buffer; every rank must agree */
} control_block;
_Static_assert(sizeof(control_block) <= CONTROL_BYTES, "control block");

typedef struct {
  const hasten_host_api* host;
  size_t capacity;
  int rank, world;
  int64_t timeout_ms;
  char* prefix;   /* this communicator's store keys */
  char name[128]; /* this rank's segment, until unlinked */
  int unlinked;
  char** segments; /* world_size mappings of CONTROL_BYTES + capacity */
  unsigned long long op;
  pthread_mutex_t mutex; /* collectives of one instance run one at a time */
  atomic_int aborted;
} c_shm;

static inline control_block* control_of(const c_shm* c, int q) { return (control_block*)c->segments[q]; }
static inline char* data_of_rank(const c_shm* c, int q) { return c->segments[q] + CONTROL_BYTES; }

static inline int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* init(): names, creates and maps every rank's segment; collective. */
hasten_status c_shm_connect(c_shm* c, const hasten_comm_init* init);
/* Unmaps every segment (and removes this rank's name if init failed before it could). */
void c_shm_disconnect(c_shm* c);

#endif /* C_SHM_COMM_H */
