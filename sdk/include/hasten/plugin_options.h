/*
 * Options for plain-C plugins. Header only, C99, nothing to link.
 *
 * A plugin's options reach create() as a JSON object (options_json). The host parses it for
 * the plugin through its look-ups (ABI 1.1: host->option_int and friends), so that no plugin
 * carries a JSON parser; this header wraps them as one call per typed value, with a default
 * for an absent key, and declares option specs (ABI 1.2) so that the host checks types and
 * ranges before create() and `hasten plugins describe` prints them. Every failure is set
 * through host->set_error (plugin.h, "Errors") and returned, ready for create() to return.
 *
 * example begin
 *   #include <hasten/plugin_options.h>
 *   #include <stdlib.h>
 *   static const hasten_option_spec specs[] = {
 *       HASTEN_OPTION_SPEC("path", HASTEN_OPTION_STRING, NULL, "file to write"),
 *       HASTEN_OPTION_SPEC_RANGE("digits", HASTEN_OPTION_INT, "6", "significant digits", 1, 17),
 *       HASTEN_OPTION_SPEC_ENUM("mode", "fast,exact", "\"fast\"", "how to round"),
 *   };
 *   hasten_status read_options(const hasten_host_api* host, const char* options_json) {
 *     hasten_options o;
 *     char* path = NULL;
 *     int64_t digits = 0;
 *     hasten_status s = hasten_options_open(&o, host, "mine", options_json, specs, HASTEN_COUNT_OF(specs));
 *     if (s == HASTEN_OK) s = hasten_options_string(&o, "path", "out.txt", &path);
 *     if (s == HASTEN_OK) s = hasten_options_int(&o, "digits", 6, &digits);
 *     free(path);
 *     return s;
 *   }
 * example end
 */
#ifndef HASTEN_PLUGIN_OPTIONS_H
#define HASTEN_PLUGIN_OPTIONS_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <hasten/plugin.h>
#include <hasten/plugin_error.h>

/* ---- Declaring options (ABI 1.2): initializers of hasten_option_spec for a static array
 * that the descriptor's options and n_options point at. default_json is the value used when
 * the key is absent, as JSON text ("6", "true", "\"fast\""), or NULL; help is one line. */
#define HASTEN_OPTION_SPEC(name, type, default_json, help)                                   \
  { HASTEN_STRUCT_INIT(hasten_option_spec), (name), (type), NULL, (default_json), (help), 0, \
    0.0, 0.0, NULL, NULL }
/* INT or FLOAT with min <= value <= max (the host refuses anything else before create()). */
#define HASTEN_OPTION_SPEC_RANGE(name, type, default_json, help, min, max)               \
  { HASTEN_STRUCT_INIT(hasten_option_spec), (name), (type), NULL, (default_json), (help), \
    HASTEN_OPTION_HAS_MIN | HASTEN_OPTION_HAS_MAX, (double)(min), (double)(max), NULL, NULL }
/* A string among allowed, a comma-separated list ("fast,exact"). */
#define HASTEN_OPTION_SPEC_ENUM(name, allowed, default_json, help)                         \
  { HASTEN_STRUCT_INIT(hasten_option_spec), (name), HASTEN_OPTION_ENUM, (allowed),         \
    (default_json), (help), 0, 0.0, 0.0, NULL, NULL }
/* The length of a static array, for n_options. */
#define HASTEN_COUNT_OF(array) ((uint32_t)(sizeof(array) / sizeof((array)[0])))

/* ---- Reading options ---- */

/* The options of one create() call. Everything borrowed: valid while options_json is. */
typedef struct hasten_options {
  const hasten_host_api* host;
  const char* plugin; /* names the plugin in messages */
  const char* json;   /* the options_json create() received */
} hasten_options;

/* Prefixes the host's message of the look-up that just failed with the plugin's name. */
static inline hasten_status hasten_options_failed_(const hasten_options* o, hasten_status status) {
  char host_message[768];
  const char* m = o->host->last_error != NULL ? o->host->last_error(o->host) : "";
  /* Copied first: last_error's text lives in the buffer set_error is about to overwrite. */
  strncpy(host_message, m != NULL && *m ? m : "option look-up failed", sizeof host_message - 1);
  host_message[sizeof host_message - 1] = '\0';
  return hasten_fail(o->host, status, "%s: %s", o->plugin, host_message);
}

/* Prepares look-ups on options_json (NULL reads as "{}"). With specs, a key that no spec
 * names is refused, naming the plugin, the key and the allowed ones: the host already does
 * this before create() for a descriptor that lists its options, and checking again here keeps
 * a create() called some other way honest. A host of ABI 1.0, which has no look-ups, is
 * HASTEN_ERR_UNSUPPORTED. */
static inline hasten_status hasten_options_open(hasten_options* o, const hasten_host_api* host,
                                                const char* plugin, const char* options_json,
                                                const hasten_option_spec* specs,
                                                uint32_t n_specs) {
  size_t bytes = 1, at = 0;
  uint32_t i;
  char* allowed;
  hasten_status s;
  o->host = host;
  o->plugin = plugin != NULL ? plugin : "plugin";
  o->json = options_json != NULL ? options_json : "{}";
  if (host == NULL || host->struct_size < offsetof(hasten_host_api, option_list_item) + sizeof(void*))
    return hasten_fail(host, HASTEN_ERR_UNSUPPORTED,
                       "%s: this hasten host has no option look-ups (ABI 1.1 needed)", o->plugin);
  if (specs == NULL) return HASTEN_OK;
  for (i = 0; i < n_specs; ++i)
    if (specs[i].name != NULL) bytes += strlen(specs[i].name) + 1;
  allowed = (char*)malloc(bytes);
  if (allowed == NULL) return hasten_fail(host, HASTEN_ERR_SYSTEM, "%s: out of memory", o->plugin);
  for (i = 0; i < n_specs; ++i) {
    if (specs[i].name == NULL) continue;
    if (at > 0) allowed[at++] = ',';
    memcpy(allowed + at, specs[i].name, strlen(specs[i].name));
    at += strlen(specs[i].name);
  }
  allowed[at] = '\0';
  s = host->options_check(host, o->plugin, o->json, allowed);
  free(allowed);
  return s; /* the host's message names the plugin already */
}

/* Each look-up sets *value to the option, or to fallback when the key is absent (or null).
 * A value of another type is HASTEN_ERR_INVALID_ARGUMENT with a message naming the plugin,
 * the key, the value and the type wanted. */

static inline hasten_status hasten_options_int(const hasten_options* o, const char* key,
                                               int64_t fallback, int64_t* value) {
  int32_t found = 0;
  int64_t v = 0;
  const hasten_status s = o->host->option_int(o->host, o->json, key, &v, &found);
  if (s != HASTEN_OK) return hasten_options_failed_(o, s);
  *value = found ? v : fallback;
  return HASTEN_OK;
}

/* Integers are numbers too. */
static inline hasten_status hasten_options_double(const hasten_options* o, const char* key,
                                                  double fallback, double* value) {
  int32_t found = 0;
  double v = 0;
  const hasten_status s = o->host->option_float(o->host, o->json, key, &v, &found);
  if (s != HASTEN_OK) return hasten_options_failed_(o, s);
  *value = found ? v : fallback;
  return HASTEN_OK;
}

/* *value is 1 or 0. */
static inline hasten_status hasten_options_bool(const hasten_options* o, const char* key,
                                                int fallback, int* value) {
  int32_t found = 0, v = 0;
  const hasten_status s = o->host->option_bool(o->host, o->json, key, &v, &found);
  if (s != HASTEN_OK) return hasten_options_failed_(o, s);
  *value = found ? (v != 0) : (fallback != 0);
  return HASTEN_OK;
}

/* *value is a copy the caller releases with free(): of the option, of fallback when the key
 * is absent, or NULL when both are. On failure *value is NULL. */
static inline hasten_status hasten_options_string(const hasten_options* o, const char* key,
                                                  const char* fallback, char** value) {
  int32_t found = 0;
  size_t size = 0;
  const char* source;
  hasten_status s;
  *value = NULL;
  /* Capacity 0 asks for the size only; the second call copies. */
  s = o->host->option_string(o->host, o->json, key, NULL, 0, &size, &found);
  if (s != HASTEN_OK) return hasten_options_failed_(o, s);
  if (!found && fallback == NULL) return HASTEN_OK;
  source = found ? NULL : fallback;
  if (source != NULL) size = strlen(source) + 1;
  *value = (char*)malloc(size);
  if (*value == NULL) return hasten_fail(o->host, HASTEN_ERR_SYSTEM, "%s: out of memory", o->plugin);
  if (source != NULL) {
    memcpy(*value, source, size);
    return HASTEN_OK;
  }
  s = o->host->option_string(o->host, o->json, key, *value, size, &size, &found);
  if (s != HASTEN_OK) {
    free(*value);
    *value = NULL;
    return hasten_options_failed_(o, s);
  }
  return HASTEN_OK;
}

#endif /* HASTEN_PLUGIN_OPTIONS_H */
