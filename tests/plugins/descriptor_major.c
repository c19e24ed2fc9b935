/* Entry v1, but its descriptor claims ABI 2.0. */
#include "test_tracker.h"
TT_VTABLE(vt, tt_create, tt_log);
static const hasten_plugin_descriptor d = {sizeof(hasten_plugin_descriptor), (2u << 16), HASTEN_KIND_TRACKER,
                                           "descriptor_major", "0.1", "test", NULL, NULL, 0, &vt};
TT_ENTRY(&d)
