/* An entry function that writes through a NULL pointer (SIGSEGV). */
#include <hasten/plugin.h>

HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  (void)host; (void)abi; (void)out; (void)count;
  volatile int* nowhere = (volatile int*)0;
  *nowhere = 1;
  return HASTEN_OK;
}
