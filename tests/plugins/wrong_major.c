/* Built for a future ABI major: exports only hasten_plugin_entry_v2. */
#include <hasten/plugin.h>
__attribute__((visibility("default"))) int hasten_plugin_entry_v2(void) { return 0; }
