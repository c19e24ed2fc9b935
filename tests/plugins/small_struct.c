/* A descriptor whose struct_size is smaller than ABI 1.0's. */
#include "test_tracker.h"
TT_VTABLE(vt, tt_create, tt_log);
static const hasten_plugin_descriptor d = {8, HASTEN_ABI_VERSION, HASTEN_KIND_TRACKER,
                                           "small_struct", "0.1", "test", NULL, NULL, 0, &vt};
TT_ENTRY(&d)
