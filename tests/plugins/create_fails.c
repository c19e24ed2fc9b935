/* A tracker whose create() fails with its own message. */
#include "test_tracker.h"
static hasten_status failing_create(const hasten_host_api* host, const char* options, hasten_instance** out) {
  (void)options; (void)out;
  host->set_error(host, "create failed on purpose: option 'x' is required");
  return HASTEN_ERR_INVALID_ARGUMENT;
}
TT_VTABLE(vt, failing_create, tt_log);
TT_DESCRIPTOR(d, "create_fails", vt);
TT_ENTRY(&d)
