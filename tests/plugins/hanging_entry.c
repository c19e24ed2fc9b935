/* An entry function that never returns. */
#include <hasten/plugin.h>
#include <unistd.h>

HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  (void)host; (void)abi; (void)out; (void)count;
  for (;;) pause();
  return HASTEN_OK;
}
