/* A tracker that crashes on purpose, where its options say: {"at": "create" | "start" | "log"
 * | "destroy", "how": "segv" | "abort"}. At "log" it crashes on the third log call, after two
 * were recorded. Until then it behaves: it writes each step it gets to crash.out, so a test
 * sees that it ran. The training process must survive each crash, report it once and keep
 * every other tracker's values. */
#include <hasten/plugin.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int at_start, at_log, at_destroy, abort_;
  int logs;
  FILE* out;
} crash_t;

static void crash_now(int abort_) {
  if (abort_) abort();
  volatile int* nowhere = NULL;
  *nowhere = 1; /* a real invalid access, not a raised signal */
  raise(SIGSEGV); /* in case the store above was somehow allowed */
}

static int wants(const char* options, const char* key_value) { return strstr(options, key_value) != NULL; }

static hasten_status crash_create(const hasten_host_api* host, const char* options, hasten_instance** out) {
  (void)host;
  const int abort_ = wants(options, "\"how\":\"abort\"");
  if (wants(options, "\"at\":\"create\"")) crash_now(abort_);
  crash_t* t = (crash_t*)calloc(1, sizeof(crash_t));
  if (!t) return HASTEN_ERR_SYSTEM;
  t->abort_ = abort_;
  t->at_start = wants(options, "\"at\":\"start\"");
  t->at_log = wants(options, "\"at\":\"log\"");
  t->at_destroy = wants(options, "\"at\":\"destroy\"");
  *out = (hasten_instance*)t;
  return HASTEN_OK;
}

static void crash_destroy(hasten_instance* self) {
  crash_t* t = (crash_t*)self;
  if (t->out) fclose(t->out);
  if (t->at_destroy) crash_now(t->abort_);
  free(t);
}

static hasten_status crash_start(hasten_instance* self, const hasten_tracker_run* run) {
  crash_t* t = (crash_t*)self;
  if (t->at_start) crash_now(t->abort_);
  char path[1024];
  snprintf(path, sizeof path, "%s/crash.out", run->logging_dir);
  t->out = fopen(path, "w");
  return HASTEN_OK;
}

static hasten_status crash_log(hasten_instance* self, const hasten_scalar* v, uint32_t n, int64_t step) {
  (void)v; (void)n;
  crash_t* t = (crash_t*)self;
  if (t->at_log && ++t->logs == 3) crash_now(t->abort_);
  if (t->out) fprintf(t->out, "%lld\n", (long long)step), fflush(t->out);
  return HASTEN_OK;
}

static const hasten_tracker_vtable vt = {sizeof(hasten_tracker_vtable), HASTEN_ABI_VERSION, crash_create,
                                         crash_destroy, crash_start, crash_log, NULL, NULL, NULL};
static const hasten_plugin_descriptor d = {sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION, HASTEN_KIND_TRACKER,
                                           "crash", "0.1", "test plugin: crashes where asked", NULL, NULL, 0, &vt,
                                           NULL, 0, NULL, NULL};
static const hasten_plugin_descriptor* const list[] = {&d};
HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  (void)host; (void)abi;
  *out = list;
  *count = 1;
  return HASTEN_OK;
}
