/* plugin.h and the plain-C helpers must compile as strict C99 with every warning an error
 * (tests/abi/CMakeLists.txt). */
#include <hasten/plugin.h>
#include <hasten/plugin_error.h>
#include <hasten/plugin_options.h>

/* Touch every type so the compiler checks them. */
static size_t sizes(void) {
  return sizeof(hasten_host_api) + sizeof(hasten_plugin_descriptor) + sizeof(hasten_preset) +
         sizeof(hasten_strategy_vtable) + sizeof(hasten_precision_vtable) + sizeof(hasten_tracker_vtable) +
         sizeof(hasten_comm_vtable) + sizeof(hasten_process_info) + sizeof(hasten_coll_options) +
         sizeof(hasten_model_info) + sizeof(hasten_tracker_run) + sizeof(hasten_comm_init) + sizeof(hasten_scalar) +
         sizeof(hasten_comm_serves) + sizeof(hasten_memory_report);
}

int main(void) { return sizes() > 0 && HASTEN_ABI_VERSION_MAJOR(HASTEN_ABI_VERSION) == HASTEN_ABI_MAJOR ? 0 : 1; }
