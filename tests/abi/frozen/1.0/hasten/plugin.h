/*
 * hasten plugin ABI, version 1.0: a frozen copy of the header as released, kept so that
 * tests/abi/frozen can build plugins against it and prove that newer hosts still load them.
 * Do not edit.
 *
 * The one contract between the hasten core (the "host") and its plugins: strategies,
 * precision, trackers and communication backends. C99, no LibTorch, no C++.
 *
 * Rules (docs/plugin-abi.md has the long form):
 * - A plugin library exports one symbol per ABI major it implements, for major 1:
 *       hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t host_abi,
 *                                            const hasten_plugin_descriptor* const** out,
 *                                            uint32_t* count);
 *   The host calls it once, right after loading the library. It returns static descriptors.
 * - Every struct that crosses the boundary begins with HASTEN_STRUCT_HEADER (struct_size as
 *   the author's compiler saw it, then abi_version). Fields are only ever appended. The reader
 *   copies min(struct_size, its own sizeof) into zeroed storage, so a slot the other side does
 *   not know reads as NULL/0, which always means "not supported" / "default".
 * - Versions: HASTEN_ABI_MAJOR changes only when a layout changes incompatibly (new entry
 *   symbol _v2); HASTEN_ABI_MINOR grows when fields, slots or enum values are appended.
 * - Errors: every fallible function returns hasten_status. A non-OK status comes with a
 *   message set through host->set_error() on the same thread before returning. No C++
 *   exception may cross the boundary in either direction.
 * - Ownership is stated on every pointer: "borrowed" (valid for the duration of the call
 *   unless stated otherwise), "owned by X" or "static" (valid until the library unloads,
 *   which hasten never does before process exit).
 * - Two tiers: C-tier plugins (tracker, comm) see only C types and DLTensor and need no
 *   LibTorch. Torch-tier plugins (strategy, precision) receive opaque handles that are
 *   LibTorch objects and must declare the LibTorch build they were compiled against
 *   (torch_fingerprint); the host refuses a mismatch at load time.
 */
#ifndef HASTEN_PLUGIN_H
#define HASTEN_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Versions                                                                                    */
/* ------------------------------------------------------------------------------------------ */

#define HASTEN_ABI_MAJOR 1
#define HASTEN_ABI_MINOR 0
/* Packed as (major << 16) | minor in every abi_version field. */
#define HASTEN_ABI_VERSION ((uint32_t)((HASTEN_ABI_MAJOR << 16) | HASTEN_ABI_MINOR))
#define HASTEN_ABI_VERSION_MAJOR(v) ((uint32_t)(v) >> 16)
#define HASTEN_ABI_VERSION_MINOR(v) ((uint32_t)(v)&0xFFFFu)

/* Leads every struct that crosses the boundary. Fill with HASTEN_STRUCT_INIT(type). */
#define HASTEN_STRUCT_HEADER \
  uint32_t struct_size;      \
  uint32_t abi_version
#define HASTEN_STRUCT_INIT(type) (uint32_t) sizeof(type), HASTEN_ABI_VERSION

/* Name of the entry symbol of major 1, for dlsym. */
#define HASTEN_PLUGIN_ENTRY_V1_SYMBOL "hasten_plugin_entry_v1"

#if defined(_WIN32)
#define HASTEN_PLUGIN_EXPORT __declspec(dllexport)
#else
#define HASTEN_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status codes: a small closed set, values fixed, only ever appended.                         */
/* ------------------------------------------------------------------------------------------ */

typedef int32_t hasten_status;
enum {
  HASTEN_OK = 0,
  HASTEN_ERR_INVALID_ARGUMENT = 1, /* a bad value from the caller (config, tensor shape...) */
  HASTEN_ERR_INVALID_USAGE = 2,    /* a call in the wrong state or order                    */
  HASTEN_ERR_UNSUPPORTED = 3,      /* the operation, dtype or device is not supported       */
  HASTEN_ERR_SYSTEM = 4,           /* the OS, file system or network failed                 */
  HASTEN_ERR_TIMEOUT = 5,          /* a wait ran past its deadline                          */
  HASTEN_ERR_REMOTE = 6,           /* a peer rank failed or went away                       */
  HASTEN_ERR_INTERNAL = 7          /* a bug or an unexpected exception inside the plugin    */
};

/* ------------------------------------------------------------------------------------------ */
/* Kinds, log levels, reduce operations                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef enum hasten_plugin_kind {
  HASTEN_KIND_STRATEGY = 1,
  HASTEN_KIND_PRECISION = 2,
  HASTEN_KIND_TRACKER = 3,
  HASTEN_KIND_COMM = 4
} hasten_plugin_kind;

typedef enum hasten_log_level {
  HASTEN_LOG_TRACE = 0,
  HASTEN_LOG_DEBUG = 1,
  HASTEN_LOG_INFO = 2,
  HASTEN_LOG_WARN = 3,
  HASTEN_LOG_ERROR = 4
} hasten_log_level;

typedef enum hasten_reduce_op {
  HASTEN_REDUCE_SUM = 0,
  HASTEN_REDUCE_AVG = 1,
  HASTEN_REDUCE_MIN = 2,
  HASTEN_REDUCE_MAX = 3
} hasten_reduce_op;

/* ------------------------------------------------------------------------------------------ */
/* Opaque handles                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* A plugin instance: whatever the plugin's create() returned. Owned by the plugin, released
 * by its destroy(). The host never looks inside. */
typedef struct hasten_instance hasten_instance;

/* An outstanding asynchronous operation. Owned by whoever created it (the comm plugin, or
 * the host for host collectives); released with the matching work_free(). */
typedef struct hasten_work hasten_work;

/* Torch-tier handles. Each points at a LibTorch C++ object owned by the host and is borrowed
 * for the duration of the call: hasten_tensor is an at::Tensor, hasten_module a
 * torch::nn::Module, hasten_optimizer a torch::optim::Optimizer. Only torch-tier plugins,
 * whose fingerprint matched the host's, may dereference them (plugin.hpp converts them). */
typedef struct hasten_tensor hasten_tensor;
typedef struct hasten_module hasten_module;
typedef struct hasten_optimizer hasten_optimizer;

/* ------------------------------------------------------------------------------------------ */
/* What the host tells plugins                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Where this process sits. Filled by host->process_info(). */
typedef struct hasten_process_info {
  HASTEN_STRUCT_HEADER;
  int32_t rank;             /* global rank, 0..world_size-1                     */
  int32_t world_size;       /* number of processes in the run                   */
  int32_t local_rank;       /* rank among the processes of this machine         */
  int32_t local_world_size; /* processes on this machine                        */
  int32_t node_rank;        /* machine index, 0..num_nodes-1                    */
  int32_t num_nodes;        /* machines in the run                              */
  int64_t timeout_ms;       /* the run's collective/rendezvous timeout          */
} hasten_process_info;

/* Per-call options of a collective. NULL means all defaults. */
typedef struct hasten_coll_options {
  HASTEN_STRUCT_HEADER;
  void* stream;       /* borrowed: a cudaStream_t for CUDA buffers, NULL for CPU or default  */
  int64_t timeout_ms; /* 0: the run's timeout                                               */
} hasten_coll_options;

/*
 * The host API: a const table the host hands to the entry point and to every create().
 * Valid until the process ends. Each function takes the table itself first, so a host may
 * serve several independent contexts (one per Accelerator). Thread-safe unless noted.
 */
typedef struct hasten_host_api hasten_host_api;
struct hasten_host_api {
  HASTEN_STRUCT_HEADER;
  const char* host_version;      /* static: hasten's version, "0.1.0"                        */
  const char* torch_fingerprint; /* static: the host's LibTorch build (see plugin descriptor) */

  /* Writes into the host's log (spdlog). plugin and message: borrowed. */
  void (*log)(const hasten_host_api* host, int32_t level, const char* plugin,
              const char* message);
  /* Records the message of the failure about to be returned; thread-local, copied. */
  void (*set_error)(const hasten_host_api* host, const char* message);
  /* Fills *out (caller sets out->struct_size). Never fails for a well-formed call. */
  hasten_status (*process_info)(const hasten_host_api* host, hasten_process_info* out);

  /* Rendezvous key-value store shared by every rank of the run (c10d TCPStore hosted by
   * rank 0). HASTEN_ERR_UNSUPPORTED when the run has one process and no store. */
  hasten_status (*store_set)(const hasten_host_api* host, const char* key, const void* data,
                             size_t size);
  /* Waits up to timeout_ms (0: the run's timeout) for key. If capacity is too small, returns
   * HASTEN_ERR_INVALID_ARGUMENT with *size set to the size needed. */
  hasten_status (*store_get)(const hasten_host_api* host, const char* key, void* buffer,
                             size_t capacity, size_t* size, int64_t timeout_ms);
  /* Atomically adds delta to the integer at key (created as 0) and returns the new value. */
  hasten_status (*store_add)(const hasten_host_api* host, const char* key, int64_t delta,
                             int64_t* result);

  /* Collectives over every rank of the run, for strategy and precision plugins. The host
   * routes by the buffer's device (CPU buffers to the CPU comm backend, CUDA buffers to the
   * GPU backend). Buffers are borrowed until the work completes. *work may come back NULL,
   * which means the operation already completed; otherwise wait on it and free it. */
  hasten_status (*allreduce)(const hasten_host_api* host, DLTensor* buffer, int32_t op,
                             const hasten_coll_options* options, hasten_work** work);
  hasten_status (*allgather)(const hasten_host_api* host, const DLTensor* input,
                             DLTensor* output, const hasten_coll_options* options,
                             hasten_work** work);
  hasten_status (*reduce_scatter)(const hasten_host_api* host, const DLTensor* input,
                                  DLTensor* output, int32_t op,
                                  const hasten_coll_options* options, hasten_work** work);
  hasten_status (*broadcast)(const hasten_host_api* host, DLTensor* buffer, int32_t root,
                             const hasten_coll_options* options, hasten_work** work);
  hasten_status (*barrier)(const hasten_host_api* host, const hasten_coll_options* options);
  /* Waits for a host work item (timeout_ms 0: the run's timeout). Does not free it. */
  hasten_status (*work_wait)(const hasten_host_api* host, hasten_work* work,
                             int64_t timeout_ms);
  /* Releases a host work item; waits for it first if it is still running. NULL is a no-op. */
  void (*work_free)(const hasten_host_api* host, hasten_work* work);
  /* The message of the last host call that failed on this thread ("" if none). Borrowed:
   * valid until the next host call on this thread. */
  const char* (*last_error)(const hasten_host_api* host);
};

/* ------------------------------------------------------------------------------------------ */
/* Plugin descriptors                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* A named option set, e.g. the zero strategy's "zero3_offload". All strings static. */
typedef struct hasten_preset {
  HASTEN_STRUCT_HEADER;
  const char* name;         /* selectable like a plugin name                          */
  const char* description;  /* one line                                               */
  const char* options_json; /* a JSON object merged under the user's options          */
} hasten_preset;

/* One plugin. Static and immutable; everything it points to is static too. */
typedef struct hasten_plugin_descriptor {
  HASTEN_STRUCT_HEADER;          /* abi_version: the ABI the plugin was built against    */
  int32_t kind;                  /* hasten_plugin_kind                                   */
  const char* name;              /* registry key: [a-z0-9_]+, unique within its kind     */
  const char* version;           /* the plugin's own version, free form                  */
  const char* description;       /* one line                                             */
  /* NULL for the C tier. For the torch tier, the LibTorch build the plugin was compiled
   * against, e.g. "torch=1.13.0;cxx11abi=1;device=cpu;stdlib=libstdc++"; the host loads the
   * plugin only if this equals its own fingerprint exactly. */
  const char* torch_fingerprint;
  const hasten_preset* presets; /* may be NULL when n_presets is 0 */
  uint32_t n_presets;
  /* The kind's vtable: hasten_{strategy,precision,tracker,comm}_vtable. Begins with
   * HASTEN_STRUCT_HEADER. */
  const void* vtable;
} hasten_plugin_descriptor;

/* The entry symbol's type. host: static (see hasten_host_api). host_abi: the host's
 * HASTEN_ABI_VERSION. On success *out points at *count static descriptor pointers. */
typedef hasten_status (*hasten_plugin_entry_v1_fn)(const hasten_host_api* host,
                                                   uint32_t host_abi,
                                                   const hasten_plugin_descriptor* const** out,
                                                   uint32_t* count);

/* ------------------------------------------------------------------------------------------ */
/* Kind: strategy (torch tier)                                                                 */
/*   Decides how models and optimizers are wrapped, how gradients are synchronised, and what   */
/*   is sharded. Calls come from the thread running the training loop, except where noted.    */
/* ------------------------------------------------------------------------------------------ */

typedef struct hasten_model_info {
  HASTEN_STRUCT_HEADER;
  uint32_t index;     /* 0 for the first prepared model, 1 for the second...         */
  DLDevice device;    /* where the model must live for this process                 */
  int32_t train;      /* non-zero when the model has parameters that need gradients */
} hasten_model_info;

typedef struct hasten_strategy_vtable {
  HASTEN_STRUCT_HEADER;
  /* Required. options_json: borrowed, a JSON object (the plugin's options, presets merged).
   * host: static. On success *out is the new instance. */
  hasten_status (*create)(const hasten_host_api* host, const char* options_json,
                          hasten_instance** out);
  /* Required. Releases the instance; never fails. */
  void (*destroy)(hasten_instance* self);
  /* Required. Takes a model in: place it on info->device, wrap it, register hooks. */
  hasten_status (*prepare_model)(hasten_instance* self, hasten_module* model,
                                 const hasten_model_info* info);
  /* Optional. An optimizer over parameters of the prepared models. */
  hasten_status (*prepare_optimizer)(hasten_instance* self, hasten_optimizer* optimizer);
  /* Optional. enabled = 0 while accumulating (no gradient communication, "no_sync"). */
  hasten_status (*set_gradient_sync)(hasten_instance* self, hasten_module* model,
                                     int32_t enabled);
  /* Optional. Called right before / after autograd runs the user's backward. after_backward
   * must leave every gradient final (all communication for this backward finished). */
  hasten_status (*before_backward)(hasten_instance* self);
  hasten_status (*after_backward)(hasten_instance* self);
  /* Optional. Around a prepared optimizer's real step (not called on skipped steps). */
  hasten_status (*before_optimizer_step)(hasten_instance* self, hasten_optimizer* optimizer);
  hasten_status (*after_optimizer_step)(hasten_instance* self, hasten_optimizer* optimizer);
  /* Optional: NULL means the host computes the norm over the model's local gradients.
   * Clips the gradients of model to max_norm and returns the total norm before clipping,
   * computed over every rank's share where gradients are sharded. */
  hasten_status (*clip_grad_norm)(hasten_instance* self, hasten_module* model, double max_norm,
                                  double norm_type, double* total_norm);
} hasten_strategy_vtable;

/* ------------------------------------------------------------------------------------------ */
/* Kind: precision (torch tier)                                                                */
/* ------------------------------------------------------------------------------------------ */

typedef struct hasten_precision_vtable {
  HASTEN_STRUCT_HEADER;
  /* Required; as for strategies. */
  hasten_status (*create)(const hasten_host_api* host, const char* options_json,
                          hasten_instance** out);
  /* Required. */
  void (*destroy)(hasten_instance* self);
  /* Optional. Refuses a device the precision cannot run on (device_type: "cpu", "cuda"). */
  hasten_status (*check_device)(hasten_instance* self, DLDevice device);
  /* Optional. Enter/leave the autocast region around a prepared model's forward (and the
   * user's autocast scope). *token is passed back to exit; nesting is allowed. Thread of
   * the caller (autocast state is thread-local). */
  hasten_status (*autocast_enter)(hasten_instance* self, DLDevice device, void** token);
  hasten_status (*autocast_exit)(hasten_instance* self, void* token);
  /* Optional. Replaces *loss (an at::Tensor, borrowed) by the tensor to run backward on. */
  hasten_status (*scale_loss)(hasten_instance* self, hasten_tensor* loss);
  /* Optional. Divides the gradients of optimizer's parameters by the loss scale, once per
   * optimizer step (later calls in the same step do nothing). */
  hasten_status (*unscale_gradients)(hasten_instance* self, hasten_optimizer* optimizer);
  /* Optional. Before a real optimizer step: unscales if needed and sets *skip non-zero when
   * the step must not run (non-finite gradients). */
  hasten_status (*before_step)(hasten_instance* self, hasten_optimizer* optimizer,
                               int32_t* skip);
  /* Optional. After the step (or its skip): update the loss scale. */
  hasten_status (*after_step)(hasten_instance* self, hasten_optimizer* optimizer,
                              int32_t skipped);
  /* Optional. The current loss scale (1.0 when there is none). */
  hasten_status (*loss_scale)(hasten_instance* self, double* scale);
} hasten_precision_vtable;

/* ------------------------------------------------------------------------------------------ */
/* Kind: tracker (C tier)                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct hasten_scalar {
  const char* name; /* borrowed */
  double value;
} hasten_scalar;

typedef struct hasten_tracker_run {
  HASTEN_STRUCT_HEADER;
  const char* project;      /* borrowed: the run's project name                           */
  const char* logging_dir;  /* borrowed: directory for the tracker's files (exists)       */
  const char* hparams_json; /* borrowed: JSON object of hyperparameters, may be "{}"      */
  int32_t rank;             /* rank of this process                                       */
} hasten_tracker_run;

typedef struct hasten_tracker_vtable {
  HASTEN_STRUCT_HEADER;
  /* Required. */
  hasten_status (*create)(const hasten_host_api* host, const char* options_json,
                          hasten_instance** out);
  /* Required. Flushes and releases; never fails. */
  void (*destroy)(hasten_instance* self);
  /* Required. Opens the run's files; called once, before any log. */
  hasten_status (*start)(hasten_instance* self, const hasten_tracker_run* run);
  /* Required. values: borrowed array of n scalars logged at step (-1: no step given). */
  hasten_status (*log_scalars)(hasten_instance* self, const hasten_scalar* values, uint32_t n,
                               int64_t step);
  /* Optional. A text entry. */
  hasten_status (*log_text)(hasten_instance* self, const char* name, const char* text,
                            int64_t step);
  /* Optional. Pushes buffered records to storage. */
  hasten_status (*flush)(hasten_instance* self);
  /* Optional. The run ended; status is HASTEN_OK or the failure that ended it. */
  hasten_status (*finish)(hasten_instance* self, hasten_status status);
} hasten_tracker_vtable;

/* ------------------------------------------------------------------------------------------ */
/* Kind: comm (C tier)                                                                         */
/*   Collectives on DLTensor buffers, after rendezvous through host->store_*. All operations   */
/*   are asynchronous: they return a work item that the caller waits on and frees. Buffers are */
/*   borrowed until the work completes. Every rank must issue the same operations in the same  */
/*   order.                                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef struct hasten_comm_init {
  HASTEN_STRUCT_HEADER;
  int32_t rank;
  int32_t world_size;
  int64_t timeout_ms;     /* default deadline of every wait                            */
  const char* store_prefix; /* borrowed: prefix for this communicator's store keys    */
} hasten_comm_init;

typedef struct hasten_comm_vtable {
  HASTEN_STRUCT_HEADER;
  /* Required. */
  hasten_status (*create)(const hasten_host_api* host, const char* options_json,
                          hasten_instance** out);
  /* Required. Aborts outstanding work and releases everything; never fails. */
  void (*destroy)(hasten_instance* self);
  /* Required. Connects to the other ranks through host's store. Collective. */
  hasten_status (*init)(hasten_instance* self, const hasten_comm_init* init);
  /* Required. Non-zero when the backend handles buffers on device_type (kDLCPU, kDLCUDA). */
  int32_t (*supports_device)(hasten_instance* self, int32_t device_type);
  /* Required. In place over buffer. */
  hasten_status (*allreduce)(hasten_instance* self, DLTensor* buffer, int32_t op,
                             const hasten_coll_options* options, hasten_work** work);
  /* Required. output holds world_size * numel(input) elements, rank-major. */
  hasten_status (*allgather)(hasten_instance* self, const DLTensor* input, DLTensor* output,
                             const hasten_coll_options* options, hasten_work** work);
  /* Optional (the host falls back to allreduce plus a slice). output holds
   * numel(input) / world_size elements: this rank's reduced slice. */
  hasten_status (*reduce_scatter)(hasten_instance* self, const DLTensor* input,
                                  DLTensor* output, int32_t op,
                                  const hasten_coll_options* options, hasten_work** work);
  /* Required. In place; root's buffer is copied to every rank. */
  hasten_status (*broadcast)(hasten_instance* self, DLTensor* buffer, int32_t root,
                             const hasten_coll_options* options, hasten_work** work);
  /* Required. */
  hasten_status (*barrier)(hasten_instance* self, const hasten_coll_options* options,
                           hasten_work** work);
  /* Required. Waits until work completes (timeout_ms 0: the init timeout). A failure of the
   * operation (a dead peer, a timeout) is returned here with its message. */
  hasten_status (*work_wait)(hasten_instance* self, hasten_work* work, int64_t timeout_ms);
  /* Optional. *done = non-zero when work has completed; never blocks. */
  hasten_status (*work_test)(hasten_instance* self, hasten_work* work, int32_t* done);
  /* Required. Releases work (waiting for it first if needed). NULL is a no-op. */
  void (*work_free)(hasten_instance* self, hasten_work* work);
  /* Optional. Makes every pending and future operation fail promptly (used when a peer is
   * known to be dead); callable from any thread. */
  void (*abort)(hasten_instance* self);
} hasten_comm_vtable;

/* ------------------------------------------------------------------------------------------ */
/* The entry point a plugin library defines (one per major it implements).                     */
/* ------------------------------------------------------------------------------------------ */

HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(
    const hasten_host_api* host, uint32_t host_abi, const hasten_plugin_descriptor* const** out,
    uint32_t* count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HASTEN_PLUGIN_H */
