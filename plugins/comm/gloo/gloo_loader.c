/* Comm plugin "gloo", the library hasten loads: it loads the implementation
 * (gloo/libhasten-comm-gloo-impl.so, next to this file) with RTLD_DEEPBIND and hands the host
 * its descriptors.
 *
 * Why two libraries: PyTorch's wheels build their own Gloo into libtorch_cpu.so and export its
 * symbols (gloo::rendezvous::Context, gloo::transport::tcp::..., ~300 of them). The plugin links
 * the system's libgloo, another version with other class layouts. Loaded the usual way, every
 * gloo:: call the plugin or libgloo itself makes binds to LibTorch's copy, already in the
 * process, and crashes there. RTLD_DEEPBIND puts the implementation's own dependencies (libgloo)
 * ahead of the global scope for everything loaded with it. Only the implementation is loaded so:
 * DEEPBIND suits a library that shares nothing but C types with the process (a C-tier plugin),
 * and the core keeps loading plugins the ordinary way. */
#define _GNU_SOURCE
#include <hasten/plugin.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef hasten_status (*entry_fn)(const hasten_host_api*, uint32_t, const hasten_plugin_descriptor* const**,
                                  uint32_t*);

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static entry_fn g_entry = NULL;
static char g_error[4096 + 512];  /* room for a full path and dlerror()'s line */

static void load_implementation(void) {
  Dl_info self;
  if (dladdr((void*)&load_implementation, &self) == 0 || self.dli_fname == NULL) {
    snprintf(g_error, sizeof g_error, "gloo: cannot tell where the plugin library is");
    return;
  }
  char path[4096];
  const char* slash = strrchr(self.dli_fname, '/');
  const int dir_len = slash == NULL ? 1 : (int)(slash - self.dli_fname);
  snprintf(path, sizeof path, "%.*s/gloo/libhasten-comm-gloo-impl.so", dir_len, slash == NULL ? "." : self.dli_fname);
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (handle == NULL) {
    snprintf(g_error, sizeof g_error, "gloo: cannot load the implementation %s: %s", path, dlerror());
    return;
  }
  g_entry = (entry_fn)dlsym(handle, "hasten_plugin_entry_v1");
  if (g_entry == NULL) snprintf(g_error, sizeof g_error, "gloo: %s has no hasten_plugin_entry_v1", path);
}

HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t host_abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  pthread_once(&g_once, load_implementation);
  if (g_entry == NULL) {
    if (host != NULL && host->set_error != NULL) host->set_error(host, g_error);
    return HASTEN_ERR_SYSTEM;
  }
  return g_entry(host, host_abi, out, count);
}
