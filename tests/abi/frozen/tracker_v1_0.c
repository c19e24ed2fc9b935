/* A tracker compiled against the frozen ABI 1.0 header (tests/abi/frozen/1.0/hasten/plugin.h) and,
 * by tests/abi/CMakeLists.txt, against each later minor's frozen header: it
 * proves that a host of a later minor still loads a 1.0 plugin and hands it the 1.0 layouts
 * (hasten_scalar without a struct header). It writes "step name value" lines and
 * "text step name: text" lines to <logging_dir>/<project>/v1_0_tracker.txt. */
#include <hasten/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct v10_tracker {
  FILE* out;
} v10_tracker;

static hasten_status v10_create(const hasten_host_api* host, const char* options, hasten_instance** out) {
  (void)host;
  (void)options;
  *out = (hasten_instance*)calloc(1, sizeof(v10_tracker));
  return *out ? HASTEN_OK : HASTEN_ERR_SYSTEM;
}

static void v10_destroy(hasten_instance* self) {
  v10_tracker* t = (v10_tracker*)self;
  if (t->out) fclose(t->out);
  free(t);
}

static hasten_status v10_start(hasten_instance* self, const hasten_tracker_run* run) {
  v10_tracker* t = (v10_tracker*)self;
  char path[4096];
  snprintf(path, sizeof path, "%s/v1_0_tracker.txt", run->logging_dir);
  t->out = fopen(path, "w");
  return t->out ? HASTEN_OK : HASTEN_ERR_SYSTEM;
}

static hasten_status v10_log(hasten_instance* self, const hasten_scalar* values, uint32_t n, int64_t step) {
  v10_tracker* t = (v10_tracker*)self;
  uint32_t i;
  for (i = 0; i < n; ++i) fprintf(t->out, "%lld %s %.9g\n", (long long)step, values[i].name, values[i].value);
  return HASTEN_OK;
}

static hasten_status v10_text(hasten_instance* self, const char* name, const char* text, int64_t step) {
  v10_tracker* t = (v10_tracker*)self;
  fprintf(t->out, "text %lld %s: %s\n", (long long)step, name, text);
  return HASTEN_OK;
}

static hasten_status v10_flush(hasten_instance* self) {
  v10_tracker* t = (v10_tracker*)self;
  return fflush(t->out) == 0 ? HASTEN_OK : HASTEN_ERR_SYSTEM;
}

static const hasten_tracker_vtable vt = {sizeof(hasten_tracker_vtable), HASTEN_ABI_VERSION, v10_create,
                                         v10_destroy, v10_start, v10_log, v10_text, v10_flush, NULL};
static const hasten_plugin_descriptor d = {sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION,
                                           HASTEN_KIND_TRACKER, "v1_0_tracker", "1.0",
                                           "a tracker built against ABI 1.0", NULL, NULL, 0, &vt};
static const hasten_plugin_descriptor* const list[] = {&d};

HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t host_abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  (void)host;
  if (HASTEN_ABI_VERSION_MAJOR(host_abi) != HASTEN_ABI_MAJOR) return HASTEN_ERR_UNSUPPORTED;
  *out = list;
  *count = 1;
  return HASTEN_OK;
}
