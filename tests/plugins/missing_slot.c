/* A tracker without its required log_scalars slot. */
#include "test_tracker.h"
TT_VTABLE(vt, tt_create, NULL);
TT_DESCRIPTOR(d, "missing_slot", vt);
TT_ENTRY(&d)
