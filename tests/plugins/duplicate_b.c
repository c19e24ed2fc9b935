/* Declares tracker "duplicate" again: refused as a duplicate of duplicate_a's. */
#include "test_tracker.h"
TT_VTABLE(vt, tt_create, tt_log);
TT_DESCRIPTOR(d, "duplicate", vt);
TT_ENTRY(&d)
