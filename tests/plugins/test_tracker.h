/* A minimal, valid tracker vtable shared by the test plugins: each file varies one thing. */
#ifndef HASTEN_TEST_TRACKER_H
#define HASTEN_TEST_TRACKER_H
#include <hasten/plugin.h>
#include <stdlib.h>

static hasten_status tt_create(const hasten_host_api* host, const char* options, hasten_instance** out) {
  (void)host; (void)options;
  *out = (hasten_instance*)malloc(1);
  return HASTEN_OK;
}
static void tt_destroy(hasten_instance* self) { free(self); }
static hasten_status tt_start(hasten_instance* self, const hasten_tracker_run* run) {
  (void)self; (void)run;
  return HASTEN_OK;
}
static hasten_status tt_log(hasten_instance* self, const hasten_scalar* v, uint32_t n, int64_t step) {
  (void)self; (void)v; (void)n; (void)step;
  return HASTEN_OK;
}
#define TT_VTABLE(name, create_fn, log_fn)                                                   \
  static const hasten_tracker_vtable name = {sizeof(hasten_tracker_vtable), HASTEN_ABI_VERSION, \
                                             create_fn, tt_destroy, tt_start, log_fn, NULL,    \
                                             NULL, NULL}
#define TT_DESCRIPTOR(var, plugin_name, vt)                                                  \
  static const hasten_plugin_descriptor var = {sizeof(hasten_plugin_descriptor),             \
                                               HASTEN_ABI_VERSION, HASTEN_KIND_TRACKER,      \
                                               plugin_name, "0.1", "test plugin", NULL, NULL, 0, &vt, \
                                               NULL, 0, NULL, NULL}
#define TT_ENTRY(...)                                                                        \
  static const hasten_plugin_descriptor* const tt_list[] = {__VA_ARGS__};                   \
  HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(                                 \
      const hasten_host_api* host, uint32_t abi, const hasten_plugin_descriptor* const** out, \
      uint32_t* count) {                                                                     \
    (void)host; (void)abi;                                                                   \
    *out = tt_list;                                                                          \
    *count = (uint32_t)(sizeof tt_list / sizeof tt_list[0]);                                 \
    return HASTEN_OK;                                                                        \
  }
#endif
