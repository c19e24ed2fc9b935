/* A torch-tier strategy that claims another LibTorch build. */
#include <hasten/plugin.h>
#include <stddef.h>
static hasten_status create(const hasten_host_api* h, const char* o, hasten_instance** out) {
  (void)h; (void)o; *out = (hasten_instance*)1; return HASTEN_OK;
}
static void destroy(hasten_instance* s) { (void)s; }
static hasten_status prepare(hasten_instance* s, hasten_module* m, const hasten_model_info* i) {
  (void)s; (void)m; (void)i; return HASTEN_OK;
}
static const hasten_strategy_vtable vt = {sizeof(hasten_strategy_vtable), HASTEN_ABI_VERSION, create, destroy,
                                          prepare, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
static const hasten_plugin_descriptor d = {sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION,
                                           HASTEN_KIND_STRATEGY, "fingerprint_mismatch", "0.1", "test",
                                           "torch=0.4.1;cxx11abi=0;device=cpu;stdlib=libstdc++", NULL, 0, &vt};
static const hasten_plugin_descriptor d2 = {sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION,
                                            HASTEN_KIND_STRATEGY, "no_fingerprint", "0.1", "test",
                                            NULL, NULL, 0, &vt};
static const hasten_plugin_descriptor* const list[] = {&d, &d2};
HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  (void)host; (void)abi; *out = list; *count = 2; return HASTEN_OK;
}
