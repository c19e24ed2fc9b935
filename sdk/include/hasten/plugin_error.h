/*
 * Reporting a failure from a plain-C plugin in one statement. Header only, C99, nothing to
 * link: the ABI's error channel is host->set_error() on the failing thread, then a non-OK
 * status (plugin.h, "Errors"); this formats the message and does both.
 *
 * example begin
 *   #include <hasten/plugin_error.h>
 *   #include <errno.h>
 *   #include <string.h>
 *   hasten_status open_failed(const hasten_host_api* host, const char* path) {
 *     return hasten_fail(host, HASTEN_ERR_SYSTEM, "cannot open %s: %s", path, strerror(errno));
 *   }
 * example end
 */
#ifndef HASTEN_PLUGIN_ERROR_H
#define HASTEN_PLUGIN_ERROR_H

#include <stdarg.h>
#include <stdio.h>

#include <hasten/plugin.h>

#if defined(__GNUC__)
#define HASTEN_PRINTF_LIKE(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define HASTEN_PRINTF_LIKE(fmt, args)
#endif

/* Formats the message as printf does (cut at 1023 bytes), records it with host->set_error
 * (which copies it) and returns status. host may be NULL: nothing is recorded. */
static inline hasten_status hasten_fail(const hasten_host_api* host, hasten_status status,
                                        const char* format, ...) HASTEN_PRINTF_LIKE(3, 4);

static inline hasten_status hasten_fail(const hasten_host_api* host, hasten_status status,
                                        const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof message, format, args);
  va_end(args);
  if (host != NULL && host->set_error != NULL) host->set_error(host, message);
  return status;
}

#endif /* HASTEN_PLUGIN_ERROR_H */
