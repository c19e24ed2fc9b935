/* A valid tracker with a preset: the happy path. */
#include "test_tracker.h"
TT_VTABLE(vt, tt_create, tt_log);
static const hasten_preset presets[] = {
    {sizeof(hasten_preset), HASTEN_ABI_VERSION, "valid_tracker_fast", "a preset", "{\"fast\": true}"}};
static const hasten_plugin_descriptor d = {sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION,
                                           HASTEN_KIND_TRACKER, "valid_tracker", "0.1", "test plugin",
                                           NULL, presets, 1, &vt};
TT_ENTRY(&d)
