/* A library whose constructor aborts: loading it at all kills the process that loads it. */
#include <hasten/plugin.h>
#include <stdlib.h>

__attribute__((constructor)) static void abort_on_load(void) { abort(); }

HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  (void)host; (void)abi; (void)out; (void)count;
  return HASTEN_ERR_INTERNAL;
}
