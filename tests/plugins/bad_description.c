/* Trackers whose ABI 1.2 descriptions the registry refuses: a config section (strategies
 * only), an enum option without values, and a name that breaks the naming rule. */
#include "test_tracker.h"
TT_VTABLE(vt, tt_create, tt_log);

static const hasten_plugin_descriptor section = {
    sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION, HASTEN_KIND_TRACKER, "with_section", "0.1", "test plugin",
    NULL, NULL, 0, &vt, NULL, 0, "tracker_config", NULL};

static const hasten_option_spec enum_options[] = {
    {sizeof(hasten_option_spec), HASTEN_ABI_VERSION, "mode", HASTEN_OPTION_ENUM, NULL, NULL, "no values", 0, 0, 0, NULL,
     NULL}};
static const hasten_plugin_descriptor empty_enum = {
    sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION, HASTEN_KIND_TRACKER, "empty_enum", "0.1", "test plugin",
    NULL, NULL, 0, &vt, enum_options, 1, NULL, NULL};

static const hasten_option_spec bad_name_options[] = {
    {sizeof(hasten_option_spec), HASTEN_ABI_VERSION, "Bad-Name", HASTEN_OPTION_BOOL, NULL, NULL, "", 0, 0, 0, NULL,
     NULL}};
static const hasten_plugin_descriptor bad_name = {
    sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION, HASTEN_KIND_TRACKER, "bad_option_name", "0.1", "test plugin",
    NULL, NULL, 0, &vt, bad_name_options, 1, NULL, NULL};

TT_ENTRY(&section, &empty_enum, &bad_name)
