/* A valid tracker laid out as one built against a later minor would be: its option and preset
 * structs carry a field appended after this host's, so the elements of its arrays are longer
 * than the host's sizeof. The host must step through them by the struct_size they declare
 * (plugin.h's stride rule); reading element 1 at the host's sizeof lands in element 0. */
#include "test_tracker.h"

typedef struct {
  hasten_option_spec base;
  const char* added_later;
} option_next;

typedef struct {
  hasten_preset base;
  const char* added_later;
} preset_next;

TT_VTABLE(vt, tt_create, tt_log);

static const option_next options[] = {
    {{sizeof(option_next), HASTEN_ABI_VERSION, "level", HASTEN_OPTION_INT, NULL, "1", "0 to 3",
      HASTEN_OPTION_HAS_MIN | HASTEN_OPTION_HAS_MAX, 0, 3, NULL, NULL},
     "a field of a later minor"},
    {{sizeof(option_next), HASTEN_ABI_VERSION, "mode", HASTEN_OPTION_ENUM, "fast,exact", "\"fast\"", "how", 0, 0, 0,
      NULL, NULL},
     "a field of a later minor"}};
static const preset_next presets[] = {
    {{sizeof(preset_next), HASTEN_ABI_VERSION, "longer_fast", "the fast mode", "{\"mode\": \"fast\"}"}, "later"},
    {{sizeof(preset_next), HASTEN_ABI_VERSION, "longer_exact", "the exact mode", "{\"mode\": \"exact\"}"}, "later"}};
static const hasten_plugin_descriptor d = {
    sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION, HASTEN_KIND_TRACKER, "longer_elements", "0.1", "test plugin",
    NULL, (const hasten_preset*)presets, 2, &vt, (const hasten_option_spec*)options, 2, NULL, NULL};
TT_ENTRY(&d)
