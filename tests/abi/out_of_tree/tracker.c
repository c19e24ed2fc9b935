/* An out-of-tree tracker in plain C: appends "step name=value" lines to oot_tracker.log. */
#include <hasten/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const hasten_host_api* host;
  FILE* file;
} oot_tracker;

static hasten_status create(const hasten_host_api* host, const char* options, hasten_instance** out) {
  oot_tracker* t = (oot_tracker*)calloc(1, sizeof *t);
  (void)options;
  if (!t) return HASTEN_ERR_SYSTEM;
  t->host = host;
  *out = (hasten_instance*)t;
  return HASTEN_OK;
}

static void destroy(hasten_instance* self) {
  oot_tracker* t = (oot_tracker*)self;
  if (t->file) fclose(t->file);
  free(t);
}

static hasten_status start(hasten_instance* self, const hasten_tracker_run* run) {
  oot_tracker* t = (oot_tracker*)self;
  char path[4096];
  snprintf(path, sizeof path, "%s/oot_tracker.log", run->logging_dir);
  t->file = fopen(path, "w");
  if (!t->file) {
    t->host->set_error(t->host, "cannot open oot_tracker.log");
    return HASTEN_ERR_SYSTEM;
  }
  t->host->log(t->host, HASTEN_LOG_INFO, "oot_c", "out-of-tree tracker started");
  return HASTEN_OK;
}

static hasten_status log_scalars(hasten_instance* self, const hasten_scalar* v, uint32_t n, int64_t step) {
  oot_tracker* t = (oot_tracker*)self;
  uint32_t i;
  for (i = 0; i < n; ++i) fprintf(t->file, "%lld %s=%g\n", (long long)step, v[i].name, v[i].value);
  fflush(t->file);
  return HASTEN_OK;
}

static const hasten_tracker_vtable vtable = {sizeof(hasten_tracker_vtable), HASTEN_ABI_VERSION, create, destroy,
                                             start, log_scalars, NULL, NULL, NULL};
static const hasten_plugin_descriptor descriptor = {sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION,
                                                    HASTEN_KIND_TRACKER, "oot_c", "0.1",
                                                    "out-of-tree tracker in C", NULL, NULL, 0, &vtable};
static const hasten_plugin_descriptor* const plugins[] = {&descriptor};

HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t host_abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  (void)host;
  if (HASTEN_ABI_VERSION_MAJOR(host_abi) != HASTEN_ABI_MAJOR) return HASTEN_ERR_UNSUPPORTED;
  *out = plugins;
  *count = 1;
  return HASTEN_OK;
}
