/* A valid tracker that describes its options (ABI 1.2): the host checks them before create,
 * which fails if a key it was promised never to see reaches it. */
#include <string.h>

#include "test_tracker.h"

static hasten_status described_create(const hasten_host_api* host, const char* options, hasten_instance** out) {
  if (strstr(options, "unknown") != NULL) {
    host->set_error(host, "described: the host let an unknown key through");
    return HASTEN_ERR_INTERNAL;
  }
  return tt_create(host, options, out);
}
TT_VTABLE(vt, described_create, tt_log);

static const hasten_option_spec options[] = {
    {sizeof(hasten_option_spec), HASTEN_ABI_VERSION, "level", HASTEN_OPTION_INT, NULL, "1", "0 to 3",
     HASTEN_OPTION_HAS_MIN | HASTEN_OPTION_HAS_MAX, 0, 3, NULL, NULL},
    {sizeof(hasten_option_spec), HASTEN_ABI_VERSION, "mode", HASTEN_OPTION_ENUM, "fast,exact", "\"fast\"", "how", 0, 0, 0,
     NULL, NULL}};
static const hasten_plugin_descriptor d = {
    sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION, HASTEN_KIND_TRACKER, "described", "0.1", "test plugin",
    NULL, NULL, 0, &vt, options, 2, NULL, NULL};
TT_ENTRY(&d)
