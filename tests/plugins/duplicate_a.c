/* Declares tracker "duplicate" (discovered first) and declares "twice" twice. */
#include "test_tracker.h"
TT_VTABLE(vt, tt_create, tt_log);
TT_DESCRIPTOR(d, "duplicate", vt);
TT_DESCRIPTOR(t1, "twice", vt);
TT_DESCRIPTOR(t2, "twice", vt);
TT_ENTRY(&d, &t1, &t2)
