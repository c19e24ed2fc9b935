// A tracker written in C++ without the SDK's guards: its create() throws across the C ABI,
// which the host must survive and report.
#include <hasten/plugin.h>

#include <stdexcept>

extern "C" {
static hasten_status throwing_create(const hasten_host_api*, const char*, hasten_instance**) {
  throw std::runtime_error("create threw on purpose");
}
static void destroy(hasten_instance*) {}
static hasten_status start(hasten_instance*, const hasten_tracker_run*) { return HASTEN_OK; }
static hasten_status log_scalars(hasten_instance*, const hasten_scalar*, uint32_t, int64_t) { return HASTEN_OK; }
}
static const hasten_tracker_vtable vt = {sizeof(hasten_tracker_vtable), HASTEN_ABI_VERSION, throwing_create, destroy,
                                         start, log_scalars, nullptr, nullptr, nullptr};
static const hasten_plugin_descriptor d = {sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION, HASTEN_KIND_TRACKER,
                                           "create_throws", "0.1", "test", nullptr, nullptr, 0, &vt};
static const hasten_plugin_descriptor* const list[] = {&d};
extern "C" HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api*, uint32_t,
                                                                     const hasten_plugin_descriptor* const** out,
                                                                     uint32_t* count) {
  *out = list;
  *count = 1;
  return HASTEN_OK;
}
