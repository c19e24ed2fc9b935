/*
 * hasten plugin ABI, version 1.9.
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
 * - Arrays of structs (a descriptor's presets and options) are read with the stride their
 *   elements declare: element i is at i * the struct_size of element 0, and every element of
 *   one array has the same struct_size (the plugin's sizeof), so a plugin built against a minor
 *   with shorter or longer elements is read at the right offsets. Arrays of pointers and of
 *   scalars have no stride of their own. tests/abi/layouts/ freezes sizeof and offsetof of
 *   every struct per minor; tests/abi/layout_check.py fails when a field moves.
 * - Versions: HASTEN_ABI_MAJOR changes only when a layout changes incompatibly (new entry
 *   symbol _v2); HASTEN_ABI_MINOR grows with every field, slot or enum value appended, and the
 *   table below says what each minor added. A plugin built against 1.N loads in every host of
 *   major 1; a host reads a field of minor > N as NULL/0 and never calls a slot the plugin's
 *   struct_size does not cover. tests/abi/frozen keeps every minor's header and a plugin built on each.
 *
 *     minor  added
 *     1.0    everything not listed below
 *     1.1    hasten_model_info.units, n_units; strategy slots unit_pre_forward,
 *            unit_post_forward, memory_report, state_dict; hasten_memory_report;
 *            hasten_comm_serves and hasten_comm_vtable.serves (how the host picks a backend);
 *            HASTEN_STRUCT_HEADER on hasten_scalar (the host hands 1.0 trackers the 1.0
 *            layout {name, value}); host option look-ups (options_check, option_bool,
 *            option_int, option_float, option_string, option_list_item).
 *     1.2    hasten_option_spec and hasten_plugin_descriptor.options, n_options (a plugin
 *            describes its options; the host checks them before create and prints them);
 *            hasten_plugin_descriptor.config_section and distributed_types (a strategy
 *            answers to Accelerate's distributed_type values and owns a config section).
 *     1.3    strategy slots load_state_dict, optimizer_state and load_optimizer_state
 *            (checkpoints save and load what the strategy shards, on any number of ranks).
 *     1.4    hasten_comm_init.connect_timeout_ms (set-up is bounded apart from collectives).
 *     1.5    strategy slot load_state_dict_ranges (each rank reads only the slice it keeps).
 *     1.6    hasten_comm_init.device_id (the CUDA device the host picked for the rank); comm
 *            slot work_wait_stream (a wait for CUDA work that orders a stream instead of
 *            blocking the host, used by host waits on CUDA buffers; see "Stream-ordered
 *            waits" at the comm kind).
 *     1.7    precision slots state_dict and load_state_dict (a checkpoint keeps a loss
 *            scaler's scale and growth tracker, so a resumed fp16 run is the straight one);
 *            hasten_option_spec.run_setting "activation_checkpointing" on a BOOL spec.
 *     1.8    strategy slot unit_built (a unit keeps only this rank's shard as soon as it is
 *            constructed: models built without their full weights); hasten_option_spec.run_setting
 *            "sharded_init" on a BOOL spec (DeepSpeed's zero3_init_flag, FSDP's
 *            fsdp_cpu_ram_efficient_loading).
 *     1.9    tracker slots log_image, log_histogram and log_table (Accelerator::log_images,
 *            log_histogram, log_table, routed to the trackers that have them).
 *     1.10   tracker slot run_info (Accelerator::get_tracker: what names the tracker's run in
 *            its own terms, such as an MLflow run id or a TensorBoard log directory).
 *     1.11   process groups: hasten_group, hasten_coll_options.group, host->group (a rank's
 *            group along a device-mesh dimension); comm slot split and hasten_comm_split
 *            (a backend makes a communicator over a subset of its ranks).
 *
 * - Tensors in asynchronous calls: a DLTensor struct passed to any call (and its shape and
 *   strides arrays) is borrowed for the duration of the call only; a callee that needs them
 *   after returning copies them. The memory it points to (data) is borrowed until the work
 *   the call returned has completed (or, when no work came back, until the call returns).
 *   Since 1.6, a wait for CUDA work may be stream-ordered (work_wait_stream): the memory is
 *   then the caller's again in the order of the stream that was made to wait, which is what
 *   LibTorch's caching allocator needs of memory it allocated on that stream.
 * - Work items: an operation that returns a hasten_work** may set *work to NULL, which means
 *   it already completed successfully: the caller neither waits on nor frees a NULL work.
 *   This holds for host collectives (host->allreduce...) and for comm plugin operations.
 * - Names: plugin and preset names are 1 to 64 characters of [a-z0-9_-], unique within a
 *   kind across every loaded library (the loader refuses anything else).
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
#define HASTEN_ABI_MINOR 11
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

/* Since 1.11. A process group: the ranks of the run along one dimension of its device mesh
 * (host->group). Owned by the host, valid until the run ends; plugins only pass it back in
 * hasten_coll_options.group. */
typedef struct hasten_group hasten_group;

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
  /* ---- Since 1.11 ---- */
  /* Borrowed: the group a host collective runs over (host->group); NULL: every rank of the
   * run. Ranks (a broadcast's root), sizes (an allgather's output) and the reduction are the
   * group's. Only host collectives read it: the host hands a comm plugin the group's own
   * communicator (comm slot split) with options whose group is NULL. */
  const hasten_group* group;
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

  /* Writes into the host's log (hasten::Logger). plugin and message: borrowed. */
  void (*log)(const hasten_host_api* host, int32_t level, const char* plugin,
              const char* message);
  /* Records the message of the failure about to be returned; thread-local, copied. */
  void (*set_error)(const hasten_host_api* host, const char* message);
  /* Fills *out (caller sets out->struct_size). Never fails for a well-formed call. */
  hasten_status (*process_info)(const hasten_host_api* host, hasten_process_info* out);

  /* Rendezvous key-value store shared by every rank of the run (hosted by rank 0; under
   * torchrun, its agent's). HASTEN_ERR_UNSUPPORTED when the run has one process and no store. */
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
   * GPU backend). The DLTensor structs are borrowed for the call; their data until the work
   * completes. *work may come back NULL, which means the operation already completed;
   * otherwise wait on it and free it. work may be NULL: the call then completes the
   * operation before returning. */
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
  /* Waits for a host work item (timeout_ms 0: the run's timeout). Does not free it.
   * Since 1.6, a wait with timeout_ms 0 on an operation over CUDA buffers, whose backend has
   * work_wait_stream, is stream-ordered and does not block: LibTorch's current stream of the
   * calling thread on the buffer's device is made to wait for the collective. Work queued on
   * that stream afterwards sees the results, and memory the caller allocated on that stream
   * may be freed at once; memory allocated on another stream must be ordered after it (or
   * recorded on it: c10::cuda::CUDACachingAllocator::recordStream) before it is freed. A
   * failure found later (a timeout, a dead peer) aborts the backend and is returned by the
   * next collective or wait. A non-zero timeout_ms always waits on the host. */
  hasten_status (*work_wait)(const hasten_host_api* host, hasten_work* work,
                             int64_t timeout_ms);
  /* Releases a host work item; waits for it first if it is still running (CUDA work, since
   * 1.6: as work_wait with timeout_ms 0, stream-ordered). NULL is a no-op. */
  void (*work_free)(const hasten_host_api* host, hasten_work* work);
  /* The message of the last host call that failed on this thread ("" if none). Borrowed:
   * valid until the next host call on this thread. */
  const char* (*last_error)(const hasten_host_api* host);

  /* ---- Since 1.1: option look-ups, so that no plugin parses JSON by hand ----
   * options_json is the text a create() received (a JSON object); key is a top-level key.
   * A look-up of an absent key returns HASTEN_OK with *found = 0 and leaves the value alone;
   * a value of another type is HASTEN_ERR_INVALID_ARGUMENT with a message naming the key, the
   * value and the type wanted. Check host->struct_size before calling (a 1.0 host has none). */
  /* HASTEN_ERR_INVALID_ARGUMENT naming plugin, the first unknown key and the allowed ones
   * (allowed: comma-separated keys, "" for none) when options_json has a key not allowed. */
  hasten_status (*options_check)(const hasten_host_api* host, const char* plugin,
                                 const char* options_json, const char* allowed);
  hasten_status (*option_bool)(const hasten_host_api* host, const char* options_json,
                               const char* key, int32_t* value, int32_t* found);
  hasten_status (*option_int)(const hasten_host_api* host, const char* options_json,
                              const char* key, int64_t* value, int32_t* found);
  /* Integers are numbers too. */
  hasten_status (*option_float)(const hasten_host_api* host, const char* options_json,
                                const char* key, double* value, int32_t* found);
  /* Copies the string and its NUL into buffer; *size = the bytes needed (NUL included). A too
   * small capacity is HASTEN_ERR_INVALID_ARGUMENT with *size set, buffer untouched. */
  hasten_status (*option_string)(const hasten_host_api* host, const char* options_json,
                                 const char* key, char* buffer, size_t capacity, size_t* size,
                                 int32_t* found);
  /* A list of strings (a single string counts as a list of one): *count = its length (0 and
   * *found = 0 when absent); item `index` (< *count) is copied as by option_string. Call with
   * capacity 0 to learn the count and the size. */
  hasten_status (*option_list_item)(const hasten_host_api* host, const char* options_json,
                                    const char* key, uint32_t index, char* buffer,
                                    size_t capacity, size_t* size, uint32_t* count,
                                    int32_t* found);

  /* ---- Since 1.11: process groups (check host->struct_size before calling) ---- */
  /* This rank's group along the device-mesh dimension `name` (the run's parallelism_config:
   * "dp_replicate", "dp_shard", "tp", "cp", or "dp" for dp_replicate x dp_shard), its rank in
   * it (*rank, may be NULL) and its size (*size, may be NULL). Members are ordered as in the
   * world. A dimension of size 1 is this rank alone, one of the world's size is the world.
   * HASTEN_ERR_INVALID_ARGUMENT, naming the mesh's dimensions, for another name. Static after
   * the run's set-up: the host builds every group before any plugin is created. */
  hasten_status (*group)(const hasten_host_api* host, const char* name, const hasten_group** out,
                         int32_t* rank, int32_t* size);
};

/* ------------------------------------------------------------------------------------------ */
/* Plugin descriptors                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* A named option set, e.g. the zero strategy's "zero3_offload". All strings static. */
typedef struct hasten_preset {
  HASTEN_STRUCT_HEADER;
  const char* name;         /* selectable like a plugin name; same rule as plugin names */
  const char* description;  /* one line                                               */
  const char* options_json; /* a JSON object merged under the user's options          */
} hasten_preset;

/* Since 1.2. The type of one option (hasten_option_spec.type). */
typedef enum hasten_option_type {
  HASTEN_OPTION_BOOL = 1,   /* true or false                                            */
  HASTEN_OPTION_INT = 2,    /* an integer                                               */
  HASTEN_OPTION_FLOAT = 3,  /* a number (integers are numbers too)                      */
  HASTEN_OPTION_STRING = 4, /* a string                                                 */
  HASTEN_OPTION_ENUM = 5,   /* a string among `allowed`                                 */
  HASTEN_OPTION_LIST = 6,   /* a list of strings (a single string counts as a list of one) */
  HASTEN_OPTION_ANY = 7     /* any JSON value; the plugin checks it                     */
} hasten_option_type;

/* Since 1.2. Flags of hasten_option_spec. */
enum {
  HASTEN_OPTION_HAS_MIN = 1, /* INT, FLOAT: the value must be >= min */
  HASTEN_OPTION_HAS_MAX = 2  /* INT, FLOAT: the value must be <= max */
};

/*
 * Since 1.2. One option a plugin accepts, so that the host can check options before create()
 * (an unknown key, a value of the wrong type, a name not allowed or a number out of range is
 * an error naming the plugin, the key and what is allowed) and print them (`hasten plugins
 * describe NAME`). Checks that involve several options stay in the plugin. All strings static.
 *
 * Strategies only: a spec with a section_key is also a key of the plugin's config section
 * (hasten_plugin_descriptor.config_section), under Accelerate's name: the host reads
 * `<config_section>.<section_key>` from the config, checks it against this spec and hands it
 * to the strategy as option `name`. A section key with name NULL is accepted and sets no
 * option (a key of Accelerate's that has no effect in hasten; help says so).
 */
typedef struct hasten_option_spec {
  HASTEN_STRUCT_HEADER;
  const char* name;         /* key in options_json; NULL only for a section key (see above) */
  int32_t type;             /* hasten_option_type                                           */
  const char* allowed;      /* ENUM: the values, comma-separated; NULL for other types      */
  const char* default_json; /* the value the plugin uses when the key is absent, as JSON
                             * text ("3", "\"cpu\"", "true"); NULL: none, or it depends    */
  const char* help;         /* one line                                                     */
  int32_t flags;            /* HASTEN_OPTION_HAS_MIN | HASTEN_OPTION_HAS_MAX                */
  double min;
  double max;
  const char* section_key;  /* strategies: the key in config_section, NULL: none           */
  /* Strategies: a run setting (a top-level config key) the section key also sets; the host
   * accepts "gradient_accumulation_steps" (DeepSpeed's copy of it); since 1.7, on a BOOL
   * spec, "activation_checkpointing" (FSDP's fsdp_activation_checkpointing); since 1.8, on a
   * BOOL spec, "sharded_init" (zero3_init_flag, fsdp_cpu_ram_efficient_loading: the host then
   * calls unit_built). It refuses a value that disagrees with the one set at the top level,
   * and a run setting newer than the plugin's minor. NULL: none. */
  const char* run_setting;
} hasten_option_spec;

/* One plugin. Static and immutable; everything it points to is static too. */
typedef struct hasten_plugin_descriptor {
  HASTEN_STRUCT_HEADER;          /* abi_version: the ABI the plugin was built against    */
  int32_t kind;                  /* hasten_plugin_kind                                   */
  const char* name;              /* registry key: 1-64 of [a-z0-9_-], unique in its kind */
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
  /* ---- Since 1.2 ---- */
  /* The options the plugin accepts; NULL with n_options 0: not described (the plugin checks
   * its options itself and `hasten plugins describe` says nothing about them). When
   * described, the host refuses any key not listed before calling create(). */
  const hasten_option_spec* options;
  uint32_t n_options;
  /* Strategies: the config section the plugin owns (Accelerate's "fsdp_config",
   * "deepspeed_config"; [a-z0-9_]+, not a key hasten has, unique across strategies); its
   * keys are the options' section_key values. NULL: none. */
  const char* config_section;
  /* Strategies: the config key distributed_type values that select this strategy when the
   * key `strategy` is not set, comma-separated ("MULTI_CPU,MULTI_GPU"; each [A-Z0-9_]+ and
   * claimed by one strategy only). The strategy that answers to MULTI_CPU is also the one a
   * run started as several processes uses when distributed_type is not set. NULL: none. */
  const char* distributed_types;
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
  /* Since 1.1. The model's sharding units (hasten::Unit), borrowed for the call; the modules live as
   * long as the model. units[0] is the model itself: the unit of every parameter that no
   * nested unit owns. units[1..n_units-1] are the nested units in the order of
   * model.modules(). A model that declares no units has n_units == 1. */
  hasten_module* const* units;
  uint32_t n_units;
} hasten_model_info;

/* Since 1.1. Bytes a strategy holds on this rank, now and at their peak since prepare. */
typedef struct hasten_memory_report {
  HASTEN_STRUCT_HEADER;
  uint64_t params;           /* full (unsharded) parameters currently allocated           */
  uint64_t param_shards;     /* parameter shards, including float32 master shards         */
  uint64_t grads;            /* gradients, full and sharded                               */
  uint64_t optimizer;        /* optimizer state                                           */
  uint64_t peak_params;      /* peaks of the four above                                   */
  uint64_t peak_param_shards;
  uint64_t peak_grads;
  uint64_t peak_optimizer;
} hasten_memory_report;

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
  /* ---- Since 1.1 ---- */
  /* Optional: sharding units. The host calls them on the thread running the unit's forward:
   * before it (unit_pre_forward) and after it with its tensor outputs (unit_post_forward;
   * outputs borrowed for the call, the strategy may register hooks on them). `unit` indexes
   * hasten_model_info.units of `model` (0: the model itself, around the prepared model's
   * forward). Strategies that shard nothing leave both NULL. */
  hasten_status (*unit_pre_forward)(hasten_instance* self, hasten_module* model, uint32_t unit);
  hasten_status (*unit_post_forward)(hasten_instance* self, hasten_module* model, uint32_t unit,
                                     hasten_tensor* const* outputs, uint32_t n_outputs);
  /* Optional: what this rank holds (caller sets out->struct_size). NULL: the host counts
   * the models' parameters and gradients and the optimizers' state itself. */
  hasten_status (*memory_report)(hasten_instance* self, hasten_memory_report* out);
  /* Optional: the model's parameters as (name, tensor) pairs, through `emit` (called on this
   * thread; name and value borrowed for the call, copy what you keep). kind 0: the full
   * tensors, emitted on rank 0 only (every rank must call: sharded strategies gather one unit
   * at a time). kind 1: this rank's shards, each emitted as "<name>@<offset>:<length>" (a 1-D
   * piece of the flattened parameter). NULL: the host reads the model's own parameters. */
  hasten_status (*state_dict)(hasten_instance* self, hasten_module* model, int32_t kind,
                              void (*emit)(void* ctx, const char* name, hasten_tensor* value),
                              void* ctx);
  /* ---- Since 1.3 ---- */
  /* Optional: loads full tensors (the layout of state_dict kind 0: parameters and buffers by
   * name, every rank passing the same n values; names and values borrowed for the call) into
   * the model, re-slicing what the strategy shards, whatever the number of ranks that saved
   * them. A name the model lacks, or a shape that differs, is HASTEN_ERR_INVALID_ARGUMENT.
   * Collective. NULL: the host copies them into the model's own parameters and buffers. */
  hasten_status (*load_state_dict)(hasten_instance* self, hasten_module* model,
                                   const char* const* names, hasten_tensor* const* values,
                                   uint32_t n);
  /* Optional: this rank's state of `optimizer` for model's parameters, through `emit` (as for
   * state_dict): "<param>/<key>@<offset>:<length>" for a 1-D piece of a state tensor shaped
   * like the parameter (offset into the flattened parameter), "<param>/<key>" for a 0-d one
   * ("step"). Keys as hasten::sdk::param_state names them. Pieces the strategy holds on every
   * rank alike (nothing sharded) are emitted by rank 0 only. Collective. NULL: the host reads
   * the optimizer's state of the model's own parameters on rank 0. */
  hasten_status (*optimizer_state)(hasten_instance* self, hasten_optimizer* optimizer,
                                   hasten_module* model,
                                   void (*emit)(void* ctx, const char* name, hasten_tensor* value),
                                   void* ctx);
  /* Optional: loads full optimizer state ("<param>/<key>": state tensors flattened to 1-D, and
   * 0-d scalars) for model's parameters, re-slicing what the strategy shards: read only the
   * slice this rank keeps. On as many ranks under the same strategy as saved, only the ranges
   * this rank's optimizer_state emitted at the save are filled (ranks pass different values);
   * the host then checks through optimizer_state that every piece held is one of them, else
   * calls again with every rank's pieces assembled. Names and values borrowed for the call.
   * NULL: the host sets the state of the model's own parameters. */
  hasten_status (*load_optimizer_state)(hasten_instance* self, hasten_optimizer* optimizer,
                                        hasten_module* model, const char* const* names,
                                        hasten_tensor* const* values, uint32_t n);
  /* ---- Since 1.5 ---- */
  /* Optional: loads the model's parameters and buffers (the layout of state_dict kind 0) by
   * asking the host for only the ranges this rank keeps, so that no rank reads the whole
   * state dict. For each range the strategy calls
   *     read(ctx, name, shape, ndim, offset, dst)
   * on this thread: elements [offset, offset + numel(dst)) of the flattened tensor `name`,
   * whose full shape the model has as shape[0..ndim), go into dst (borrowed at::Tensor; any
   * device and dtype, converted as needed). read returns HASTEN_OK or a failure status with
   * the host's message already set; the strategy then returns that status. A name may be read
   * in several ranges or, when this rank keeps none of it, not at all; the host itself checks
   * that the model and the state dict hold the same names. Not collective. NULL: the host
   * calls load_state_dict with full tensors. */
  hasten_status (*load_state_dict_ranges)(
      hasten_instance* self, hasten_module* model,
      hasten_status (*read)(void* ctx, const char* name, const int64_t* shape, uint32_t ndim,
                            int64_t offset, hasten_tensor* dst),
      void* ctx);
  /* ---- Since 1.8 ---- */
  /* Optional: models built without their full weights. With the run setting sharded_init on,
   * the host calls it right after a hasten::Unit's constructor returns (the unit's parameters
   * are initialised in full), from the Accelerator's construction until its first
   * prepare_model, on the thread that builds the model. unit: borrowed, the unit being built;
   * info: as prepare_model's, for the unit's subtree (units[0] is the unit itself, then the
   * units nested in it, each already passed here), device the run's. The strategy may keep
   * only what this rank holds at rest of the parameters the unit owns (not its nested units'),
   * leaving them 0-element tensors of the same dtype until prepare_model, which must then
   * restore them and adopt what was kept. Rank 0's values win (the strategy broadcasts them).
   * Collective: every rank builds the same units in the same order. NULL: units are built
   * whole and sharded_init has no effect (the host warns). */
  hasten_status (*unit_built)(hasten_instance* self, hasten_module* unit,
                              const hasten_model_info* info);
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
  /* Since 1.7. Optional (NULL: the precision keeps no state). The state a checkpoint keeps (a
   * loss scaler's scale and growth tracker), as the text of one JSON object: written into
   * buffer (borrowed, capacity bytes, NUL included) when it fits; *size receives the bytes
   * needed, NUL included. capacity 0 only asks for the size. Not collective. */
  hasten_status (*state_dict)(hasten_instance* self, char* buffer, size_t capacity, size_t* size);
  /* Since 1.7. Optional; required with state_dict. Restores what state_dict wrote (json:
   * borrowed, NUL-terminated), before the step after which it was saved. A text it cannot
   * read is HASTEN_ERR_INVALID_ARGUMENT with a message naming what is wrong. Not collective. */
  hasten_status (*load_state_dict)(hasten_instance* self, const char* json);
} hasten_precision_vtable;

/* ------------------------------------------------------------------------------------------ */
/* Kind: tracker (C tier)                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* One named value of log_scalars. Since 1.1 it leads with HASTEN_STRUCT_HEADER, like every
 * struct that crosses the boundary. The host passes arrays in the layout of the minor the
 * tracker's vtable declares, so a tracker indexes values[i] with its own sizeof; a tracker
 * of minor 0 receives the 1.0 layout {const char* name; double value;}. */
typedef struct hasten_scalar {
  HASTEN_STRUCT_HEADER;
  const char* name; /* borrowed */
  double value;     /* logged as given: NaN and infinities included */
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
  /* Required. values: borrowed array of n scalars logged at step (-1: no step given), in
   * the layout of this vtable's minor (see hasten_scalar). */
  hasten_status (*log_scalars)(hasten_instance* self, const hasten_scalar* values, uint32_t n,
                               int64_t step);
  /* Optional. A text entry (Accelerator::log_text). NULL: the tracker keeps no text. */
  hasten_status (*log_text)(hasten_instance* self, const char* name, const char* text,
                            int64_t step);
  /* Optional. Pushes buffered records to storage. */
  hasten_status (*flush)(hasten_instance* self);
  /* Optional. The run ended; status is HASTEN_OK or the failure that ended it. */
  hasten_status (*finish)(hasten_instance* self, hasten_status status);
  /* 1.9. Optional. An image (Accelerator::log_images): name and pixels, borrowed for the call;
   * pixels are height * width * channels bytes (at most 64 MiB), row after row, each pixel's
   * channels together (HWC);
   * channels 1 (grey), 3 (RGB) or 4 (RGBA). NULL: the tracker keeps no images. */
  hasten_status (*log_image)(hasten_instance* self, const char* name, const uint8_t* pixels, uint32_t height,
                             uint32_t width, uint32_t channels, int64_t step);
  /* 1.9. Optional. The values of a histogram (Accelerator::log_histogram): name and n >= 1
   * doubles, borrowed for the call, finite ones only; the tracker buckets them its own way.
   * NULL: the tracker keeps no histograms. */
  hasten_status (*log_histogram)(hasten_instance* self, const char* name, const double* values, uint64_t n,
                                 int64_t step);
  /* 1.9. Optional. A table (Accelerator::log_table): name and table_json, borrowed for the
   * call, the text of one JSON object {"columns": [names], "data": [[cell, ...], ...]} whose
   * cells are strings or finite numbers (others come as "nan", "inf", "-inf"). NULL: the
   * tracker keeps no tables. */
  hasten_status (*log_table)(hasten_instance* self, const char* name, const char* table_json, int64_t step);
  /* 1.10. Optional. What names the run in the tracker's own terms (Accelerator::get_tracker):
   * *json_out is set to the text of one JSON object whose values are strings, for example
   * {"run_id": ..., "tracking_uri": ...} or {"log_dir": ...}; owned by the tracker, valid
   * until the next call on self or destroy. Called after start, from the thread that logs.
   * NULL: the tracker names nothing of its run. */
  hasten_status (*run_info)(hasten_instance* self, const char** json_out);
} hasten_tracker_vtable;

/* ------------------------------------------------------------------------------------------ */
/* Kind: comm (C tier)                                                                         */
/*   Collectives on DLTensor buffers, after rendezvous through host->store_*. All operations   */
/*   are asynchronous: they return a work item that the caller waits on and frees. Buffers are */
/*   borrowed until the work completes. Every rank must issue the same operations in the same  */
/*   order.                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * Stream-ordered waits (1.6, CUDA backends). work_wait blocks the host until the work has
 * completed. A backend may also offer work_wait_stream(self, work, stream): it enqueues on
 * `stream` a wait for the work's completion (cudaStreamWaitEvent) and returns at once.
 * - Ordering: work enqueued on `stream` after the call sees the collective's results. Nothing
 *   else is ordered: the host, and other streams, must go through `stream` (an event recorded
 *   on it, a synchronisation) or through work_wait / work_test.
 * - Buffers: their memory is the caller's again in the order of `stream`. A caller may hand
 *   it to an allocator that reuses memory only in the order of the stream it was allocated on
 *   (LibTorch's caching allocator) when that is `stream`; memory allocated on another stream
 *   must first be ordered after `stream` or recorded on it. The backend keeps nothing of the
 *   buffers beyond what the device itself still reads.
 * - Failures: a failure known at the call (an aborted communicator, an error already
 *   reported by the backend) is returned; one found later (a timeout, a dead peer) is not.
 *   The backend then aborts the communicator on its own (a watchdog), so that the waiting
 *   stream resumes and no rank hangs, logs the failure, and returns it from every later
 *   operation, wait and test. Results of a collective cut short are undefined.
 * - Deadline: the work's own (its options' timeout_ms, else init's timeout_ms), counted from
 *   the call that issued it.
 * - Freeing: work_free of a work that was made stream-ordered returns at once, whether or not
 *   it has completed: the backend keeps what it needs (its events) until the collective
 *   completes or the communicator is aborted. work_free of a work neither completed nor
 *   stream-ordered still waits for it first, as it always did.
 * The host (1.6) waits this way for collectives on CUDA buffers, with LibTorch's current
 * stream of the waiting thread, when the backend has the slot and the wait has no timeout of
 * its own; with an older backend it blocks in work_wait as before.
 */


typedef struct hasten_comm_init {
  HASTEN_STRUCT_HEADER;
  int32_t rank;
  int32_t world_size;
  int64_t timeout_ms;     /* default deadline of every wait                            */
  const char* store_prefix; /* borrowed: prefix for this communicator's store keys    */
  /* ---- Since 1.4 ---- */
  int64_t connect_timeout_ms; /* deadline of init's store waits and connections (the run's
                                 rendezvous_timeout_s); 0: timeout_ms                       */
  /* ---- Since 1.6 ---- */
  /* CUDA backends: the CUDA ordinal (as this process counts them, after
   * CUDA_VISIBLE_DEVICES) the host picked for this rank from gpu_ids and LOCAL_RANK, and made
   * current on the calling thread; the backend uses it for its communicator. -1: the host
   * picked none (a CPU backend, or a host that leaves the choice to the backend). A 1.0-1.5
   * host's struct ends before this field, and a 0 there would read as device 0: read it only
   * when struct_size >= offsetof(hasten_comm_init, device_id) + sizeof(int32_t), and treat a
   * shorter struct as -1 (hasten::sdk::Comm::init receives -1 then). */
  int32_t device_id;
} hasten_comm_init;

/* Since 1.1. What a comm backend serves, so that the host can pick one without knowing its
 * name: for each device type the run needs (CPU always, CUDA on GPU runs), the host takes the
 * backend the config key `comm` names for that device type, or, with `comm: auto`, the
 * serving backend of highest priority among those whose scope fits the run (ties: the name
 * in alphabetical order). Static. */
enum {
  HASTEN_COMM_SCOPE_ONE_MACHINE = 1, /* every rank must be on one machine (shared memory)    */
  HASTEN_COMM_SCOPE_ANY = 2          /* ranks on any machines                                */
};
typedef struct hasten_comm_serves {
  HASTEN_STRUCT_HEADER;
  const int32_t* device_types; /* static: DLDeviceType values (kDLCPU, kDLCUDA)              */
  uint32_t n_device_types;
  int32_t scope;    /* HASTEN_COMM_SCOPE_*                                                  */
  int32_t priority; /* larger wins under `comm: auto`; first-party: shm 20, gloo 10, nccl 30 */
} hasten_comm_serves;

/* Since 1.11. A sub-communicator to make (comm slot split): the ranks that pass the same color
 * form one group, ordered by `rank`. */
typedef struct hasten_comm_split {
  HASTEN_STRUCT_HEADER;
  int32_t color;            /* >= 0: the group's number, the same on each of its members        */
  int32_t rank;             /* this rank's rank in the group, 0..size-1 (distinct per member)   */
  int32_t size;             /* members of the group                                             */
  const char* store_prefix; /* borrowed for the call: prefix of the group's store keys, distinct
                               per group and per split (the host's "hasten/group/<dim>/<color>/") */
} hasten_comm_split;

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
  /* Collectives below: the DLTensor structs are borrowed for the call only, their data until
   * the work completes; *work = NULL means completed already (see the rules at the top). */
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
  /* Optional. *done = non-zero when work has completed; never blocks. NULL: the host only
   * learns of completion through work_wait. */
  hasten_status (*work_test)(hasten_instance* self, hasten_work* work, int32_t* done);
  /* Required. Releases work (waiting for it first if needed; after work_wait_stream it
   * returns at once, see "Stream-ordered waits"). NULL is a no-op. */
  void (*work_free)(hasten_instance* self, hasten_work* work);
  /* Optional. Makes every pending and future operation fail promptly; callable from any
   * thread. The host calls it when a wait failed (a timeout, a dead peer): the run is then
   * over, and no rank should block in a collective that can never complete. */
  void (*abort)(hasten_instance* self);
  /* ---- Since 1.1 ---- */
  /* Optional (static): what the backend serves. NULL: the host never picks it under `comm:
   * auto`; the config can still select it by name or path. */
  const hasten_comm_serves* serves;
  /* ---- Since 1.6 ---- */
  /* Optional (CUDA backends): enqueues on `stream` (a cudaStream_t of the work's device,
   * borrowed for the call; NULL: the legacy default stream) a wait for work's completion and
   * returns without blocking the host; work stays owned by the caller, who still frees it.
   * See "Stream-ordered waits" above for what it orders, the buffers, failures and freeing.
   * A work already completed returns HASTEN_OK at once. NULL: the host blocks in work_wait. */
  hasten_status (*work_wait_stream)(hasten_instance* self, hasten_work* work, void* stream);
  /* ---- Since 1.11 ---- */
  /* Optional. Makes *out, a communicator of this plugin over the group `split` names: a new
   * instance of this vtable, already connected (the host never calls init on it), whose
   * collectives involve only the group's members, with ranks and sizes of the group. Collective
   * over self: every rank of self calls it, in the same order relative to self's other
   * operations, each with its own group (ncclCommSplit's and MPI_Comm_split's contract). The
   * host destroys *out before self. NULL: the backend has no groups; the host then refuses, with
   * one line, only a run whose device mesh needs groups (a dimension neither 1 nor the world). */
  hasten_status (*split)(hasten_instance* self, const hasten_comm_split* split, hasten_instance** out);
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
