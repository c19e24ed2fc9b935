/*
 * Tracker "c_lines", a plain-C example: one line per logged metric, "<step> <name> <value>"
 * ("-" for a value logged without a step), in a file named by the option `path`. Its options
 * are described (the host checks them before create and `hasten plugins describe c_lines`
 * prints them) and read with hasten/plugin_options.h. C99; links neither LibTorch nor hasten.
 */
#include <hasten/plugin.h>
#include <hasten/plugin_error.h>
#include <hasten/plugin_options.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLUGIN "c_lines"

static const hasten_option_spec options[] = {
    HASTEN_OPTION_SPEC("path", HASTEN_OPTION_STRING, NULL,
                       "file to write (default: c_lines.txt in the run's logging_dir)"),
    HASTEN_OPTION_SPEC("append", HASTEN_OPTION_BOOL, "false", "append to the file instead of replacing it"),
    HASTEN_OPTION_SPEC_RANGE("digits", HASTEN_OPTION_INT, "6", "significant digits of each value", 1, 17),
};

typedef struct {
  const hasten_host_api* host;
  char* path; /* NULL until start() when the option is absent */
  int append;
  int digits;
  FILE* file;
} lines_tracker;

static void lines_destroy(hasten_instance* self) {
  lines_tracker* t = (lines_tracker*)self;
  if (t == NULL) return;
  if (t->file != NULL) fclose(t->file);
  free(t->path);
  free(t);
}

static hasten_status lines_create(const hasten_host_api* host, const char* options_json, hasten_instance** out) {
  hasten_options o;
  int64_t digits = 6;
  lines_tracker* t = (lines_tracker*)calloc(1, sizeof *t);
  hasten_status s;
  if (t == NULL) return hasten_fail(host, HASTEN_ERR_SYSTEM, PLUGIN ": out of memory");
  t->host = host;
  s = hasten_options_open(&o, host, PLUGIN, options_json, options, HASTEN_COUNT_OF(options));
  if (s == HASTEN_OK) s = hasten_options_string(&o, "path", NULL, &t->path);
  if (s == HASTEN_OK) s = hasten_options_bool(&o, "append", 0, &t->append);
  /* The range is the host's to check (the spec says 1 to 17). */
  if (s == HASTEN_OK) s = hasten_options_int(&o, "digits", 6, &digits);
  if (s != HASTEN_OK) {
    lines_destroy((hasten_instance*)t);
    return s;
  }
  t->digits = (int)digits;
  *out = (hasten_instance*)t;
  return HASTEN_OK;
}

static hasten_status lines_start(hasten_instance* self, const hasten_tracker_run* run) {
  lines_tracker* t = (lines_tracker*)self;
  if (t->path == NULL) {
    const size_t n = strlen(run->logging_dir) + sizeof "/c_lines.txt";
    t->path = (char*)malloc(n);
    if (t->path == NULL) return hasten_fail(t->host, HASTEN_ERR_SYSTEM, PLUGIN ": out of memory");
    snprintf(t->path, n, "%s/c_lines.txt", run->logging_dir);
  }
  t->file = fopen(t->path, t->append ? "a" : "w");
  if (t->file == NULL) return hasten_fail(t->host, HASTEN_ERR_SYSTEM, PLUGIN ": cannot open %s: %s", t->path, strerror(errno));
  return HASTEN_OK;
}

static hasten_status lines_log_scalars(hasten_instance* self, const hasten_scalar* values, uint32_t n, int64_t step) {
  lines_tracker* t = (lines_tracker*)self;
  uint32_t i;
  for (i = 0; i < n; ++i) {
    /* values[i] indexes with this header's sizeof: the host hands the array in the layout of
     * the ABI minor this vtable declares. */
    if (step >= 0) fprintf(t->file, "%lld", (long long)step);
    else fputc('-', t->file);
    fprintf(t->file, " %s %.*g\n", values[i].name, t->digits, values[i].value);
  }
  /* Written at once, so that a run that dies keeps every line logged before. */
  if (fflush(t->file) != 0) return hasten_fail(t->host, HASTEN_ERR_SYSTEM, PLUGIN ": writing %s: %s", t->path, strerror(errno));
  return HASTEN_OK;
}

static hasten_status lines_finish(hasten_instance* self, hasten_status status) {
  lines_tracker* t = (lines_tracker*)self;
  const int failed = t->file != NULL && fclose(t->file) != 0;
  (void)status;
  t->file = NULL;
  return failed ? hasten_fail(t->host, HASTEN_ERR_SYSTEM, PLUGIN ": closing %s: %s", t->path, strerror(errno)) : HASTEN_OK;
}

/* Designated initializers: the slots left out (log_text, flush) stay NULL, which tells the
 * host they are absent. */
static const hasten_tracker_vtable vtable = {
    .struct_size = sizeof(hasten_tracker_vtable),
    .abi_version = HASTEN_ABI_VERSION,
    .create = lines_create,
    .destroy = lines_destroy,
    .start = lines_start,
    .log_scalars = lines_log_scalars,
    .finish = lines_finish,
};

static const hasten_plugin_descriptor descriptor = {
    .struct_size = sizeof(hasten_plugin_descriptor),
    .abi_version = HASTEN_ABI_VERSION,
    .kind = HASTEN_KIND_TRACKER,
    .name = PLUGIN,
    .version = "1.0",
    .description = "one line per metric, \"<step> <name> <value>\", in a text file (plain-C example)",
    .vtable = &vtable,
    .options = options,
    .n_options = HASTEN_COUNT_OF(options),
};

static const hasten_plugin_descriptor* const plugins[] = {&descriptor};

HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t host_abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  if (HASTEN_ABI_VERSION_MAJOR(host_abi) != HASTEN_ABI_MAJOR)
    return hasten_fail(host, HASTEN_ERR_UNSUPPORTED, PLUGIN " speaks plugin ABI major %d", HASTEN_ABI_MAJOR);
  *out = plugins;
  *count = 1;
  return HASTEN_OK;
}
