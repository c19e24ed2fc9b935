/* A strategy built against the frozen 1.10 header (tests/abi/frozen/1.10), before process groups:
 * it cannot know the device mesh. It does nothing to a CPU model (what `single` does there), and
 * takes the host's LibTorch fingerprint at entry (this file has no LibTorch to compute one).
 * tests/integration/ranks/test_tensor_parallel.cpp prepares a model under it with tp 2 (refused
 * in one line) and with tp 1 (accepted). */
#include <hasten/plugin.h>
#include <stddef.h>

static hasten_status create(const hasten_host_api* h, const char* o, hasten_instance** out) {
  (void)h;
  (void)o;
  *out = (hasten_instance*)1;
  return HASTEN_OK;
}
static void destroy(hasten_instance* s) { (void)s; }
static hasten_status prepare(hasten_instance* s, hasten_module* m, const hasten_model_info* i) {
  (void)s;
  (void)m;
  (void)i;
  return HASTEN_OK;
}
static const hasten_strategy_vtable vt = {.struct_size = sizeof(hasten_strategy_vtable),
                                          .abi_version = HASTEN_ABI_VERSION,
                                          .create = create,
                                          .destroy = destroy,
                                          .prepare_model = prepare};
static hasten_plugin_descriptor d = {.struct_size = sizeof(hasten_plugin_descriptor),
                                     .abi_version = HASTEN_ABI_VERSION,
                                     .kind = HASTEN_KIND_STRATEGY,
                                     .name = "pre_groups",
                                     .version = "0.1",
                                     .description = "a strategy of ABI 1.10 (test)",
                                     .vtable = &vt};
static const hasten_plugin_descriptor* const list[] = {&d};
HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  (void)abi;
  d.torch_fingerprint = host->torch_fingerprint;
  *out = list;
  *count = 1;
  return HASTEN_OK;
}
