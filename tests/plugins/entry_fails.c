/* An entry point that refuses to load, with a message. */
#include <hasten/plugin.h>
HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  (void)abi; (void)out; (void)count;
  host->set_error(host, "entry failed on purpose: missing licence file");
  return HASTEN_ERR_SYSTEM;
}
