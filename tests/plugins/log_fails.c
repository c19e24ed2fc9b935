/* A tracker that starts, logs once, then fails every later log as a full disk would, naming
 * the file it could not write: the host must report it once and drop it. */
#include <stdio.h>
#include <string.h>

#include "test_tracker.h"

typedef struct {
  const hasten_host_api* host;
  int logs;
  char path[512];
} lf_t;

static hasten_status lf_create(const hasten_host_api* host, const char* options, hasten_instance** out) {
  (void)options;
  lf_t* t = (lf_t*)calloc(1, sizeof(lf_t));
  if (!t) return HASTEN_ERR_SYSTEM;
  t->host = host;
  *out = (hasten_instance*)t;
  return HASTEN_OK;
}
static hasten_status lf_start(hasten_instance* self, const hasten_tracker_run* run) {
  lf_t* t = (lf_t*)self;
  snprintf(t->path, sizeof t->path, "%s/log_fails.out", run->logging_dir);
  return HASTEN_OK;
}
static hasten_status lf_log(hasten_instance* self, const hasten_scalar* v, uint32_t n, int64_t step) {
  (void)v; (void)n; (void)step;
  lf_t* t = (lf_t*)self;
  if (++t->logs == 1) return HASTEN_OK;
  char msg[700];
  snprintf(msg, sizeof msg, "cannot write %s: No space left on device", t->path);
  t->host->set_error(t->host, msg);
  return HASTEN_ERR_SYSTEM;
}
static const hasten_tracker_vtable vt = {sizeof(hasten_tracker_vtable), HASTEN_ABI_VERSION, lf_create, tt_destroy,
                                         lf_start, lf_log, NULL, NULL, NULL};
TT_DESCRIPTOR(d, "log_fails", vt);
TT_ENTRY(&d)
