/* A tracker that reads its options with hasten/plugin_options.h and does not describe them,
 * so that the host checks nothing before create() and every check is the helper's. Its
 * create() fails on purpose with what it read, for the test to compare
 * (Plugins.ThePlainCOptionsHelperReadsEveryTypeAndNamesWhatIsWrong). */
#include <hasten/plugin_options.h>

#include "test_tracker.h"

static const hasten_option_spec specs[] = {
    HASTEN_OPTION_SPEC("level", HASTEN_OPTION_INT, "1", "an integer"),
    HASTEN_OPTION_SPEC("ratio", HASTEN_OPTION_FLOAT, "0.5", "a number"),
    HASTEN_OPTION_SPEC("verbose", HASTEN_OPTION_BOOL, "false", "a bool"),
    HASTEN_OPTION_SPEC("name", HASTEN_OPTION_STRING, "\"none\"", "a string"),
};

static hasten_status c_options_create(const hasten_host_api* host, const char* options, hasten_instance** out) {
  hasten_options o;
  int64_t level = 0;
  double ratio = 0;
  int verbose = 0;
  char* name = NULL;
  hasten_status s = hasten_options_open(&o, host, "c_options", options, specs, HASTEN_COUNT_OF(specs));
  (void)out;
  if (s == HASTEN_OK) s = hasten_options_int(&o, "level", 1, &level);
  if (s == HASTEN_OK) s = hasten_options_double(&o, "ratio", 0.5, &ratio);
  if (s == HASTEN_OK) s = hasten_options_bool(&o, "verbose", 0, &verbose);
  if (s == HASTEN_OK) s = hasten_options_string(&o, "name", "none", &name);
  if (s != HASTEN_OK) return s;
  s = hasten_fail(host, HASTEN_ERR_INVALID_USAGE, "read level=%lld ratio=%g verbose=%d name=%s", (long long)level,
                  ratio, verbose, name);
  free(name);
  return s;
}
TT_VTABLE(vt, c_options_create, tt_log);
TT_DESCRIPTOR(d, "c_options", vt);
TT_ENTRY(&d)
