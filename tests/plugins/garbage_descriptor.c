/* An entry function that succeeds but hands back a descriptor list whose one entry points at
   an unmapped address: reading the descriptor faults. */
#include <hasten/plugin.h>
#include <stdint.h>

static const hasten_plugin_descriptor* const list[1] = {(const hasten_plugin_descriptor*)(uintptr_t)0x10};

HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  (void)host; (void)abi;
  *out = list;
  *count = 1;
  return HASTEN_OK;
}
