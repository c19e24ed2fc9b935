/*
 * Tracker "csv": metrics.csv (one row per log call, a `step` column then the metric names
 * in alphabetical order, empty cells for metrics a row does not have) and hparams.json,
 * in the run's logging directory; a later run in the same directory writes metrics-1.csv and
 * hparams-1.json (then -2, ...), never over an earlier run's files. When a new metric name appears the file is rewritten
 * with the wider header, as Lightning's CSVLogger does, beside the old one and renamed over
 * it, so that a kill at any moment leaves the old file or the new one whole. Plain C99, C tier.
 */
#define _POSIX_C_SOURCE 200809L /* open's O_NOFOLLOW and O_CLOEXEC, fsync, fdopen */
#include <hasten/plugin.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int64_t step; /* -1: none */
  double* values; /* one per column, in column order */
  unsigned char* present;
  size_t n_values;
} row_t;

typedef struct {
  const hasten_host_api* host;
  char* path;
  char* info; /* run_info's JSON, made on first ask */
  FILE* file;
  char** columns; /* sorted */
  size_t n_columns;
  row_t* rows;
  size_t n_rows, cap_rows;
} csv_tracker;

static hasten_status fail(const hasten_host_api* host, hasten_status status, const char* what,
                          const char* detail) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s%s%s", what, detail ? ": " : "", detail ? detail : "");
  if (host && host->set_error) host->set_error(host, msg);
  return status;
}

static char* dup_string(const char* s) {
  size_t n = strlen(s) + 1;
  char* out = (char*)malloc(n);
  if (out) memcpy(out, s, n);
  return out;
}

/* Shortest of %.15g / %.17g that reads back exactly. */
static void format_double(char* buf, size_t size, double v) {
  if (isnan(v)) { snprintf(buf, size, "nan"); return; }
  if (isinf(v)) { snprintf(buf, size, v > 0 ? "inf" : "-inf"); return; }
  snprintf(buf, size, "%.15g", v);
  if (strtod(buf, NULL) != v) snprintf(buf, size, "%.17g", v);
}

/* Writes a cell, quoting it if it holds a comma, quote or newline (RFC 4180). */
static void write_cell(FILE* f, const char* s) {
  if (strpbrk(s, ",\"\r\n") == NULL) { fputs(s, f); return; }
  fputc('"', f);
  for (; *s; ++s) {
    if (*s == '"') fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

static void write_row(FILE* f, const csv_tracker* t, const row_t* r) {
  size_t c;
  char buf[64];
  if (r->step >= 0) fprintf(f, "%lld", (long long)r->step);
  for (c = 0; c < t->n_columns; ++c) {
    fputc(',', f);
    if (c < r->n_values && r->present[c]) {
      format_double(buf, sizeof buf, r->values[c]);
      fputs(buf, f);
    }
  }
  fputc('\n', f);
}

#ifdef HASTEN_TEST_HOOKS
/* Test builds only (core/src/util/test_hooks.hpp): HASTEN_TEST_CRASH_AT=POINT:N kills the process
 * the N-th time it reaches POINT. */
static void test_point(const char* point) {
  static unsigned arrivals[2];
  const char* spec = getenv("HASTEN_TEST_CRASH_AT");
  const size_t n = strlen(point);
  const unsigned count = ++arrivals[strcmp(point, "csv-rewrite-written") == 0 ? 0 : 1];
  if (spec && strncmp(spec, point, n) == 0 && (spec[n] == '\0' ? count == 1 : spec[n] == ':' && (unsigned)atoi(spec + n + 1) == count))
    raise(SIGKILL);
}
#else
#define test_point(point) ((void)0)
#endif

/* The whole file again (a new column widens the header): written to PATH.tmp (a stale one
 * removed, then created exclusively, not through a link), flushed and renamed over PATH. The
 * new file's stream stays open for the rows that follow: after the rename it is PATH. */
static hasten_status rewrite(csv_tracker* t) {
  size_t c, i;
  const size_t n = strlen(t->path);
  char* tmp = (char*)malloc(n + 5);
  FILE* f;
  int fd;
  if (!tmp) return fail(t->host, HASTEN_ERR_SYSTEM, "out of memory", NULL);
  sprintf(tmp, "%s.tmp", t->path);
  if (unlink(tmp) != 0 && errno != ENOENT) {
    hasten_status s = fail(t->host, HASTEN_ERR_SYSTEM, tmp, strerror(errno));
    free(tmp);
    return s;
  }
  fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  f = fd < 0 ? NULL : fdopen(fd, "w");
  if (!f) {
    hasten_status s = fail(t->host, HASTEN_ERR_SYSTEM, tmp, strerror(errno));
    if (fd >= 0) close(fd);
    free(tmp);
    return s;
  }
  fputs("step", f);
  for (c = 0; c < t->n_columns; ++c) {
    fputc(',', f);
    write_cell(f, t->columns[c]);
  }
  fputc('\n', f);
  for (i = 0; i < t->n_rows; ++i) write_row(f, t, &t->rows[i]);
  if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
    hasten_status s = fail(t->host, HASTEN_ERR_SYSTEM, tmp, strerror(errno));
    fclose(f);
    unlink(tmp);
    free(tmp);
    return s;
  }
  test_point("csv-rewrite-written");
  if (rename(tmp, t->path) != 0) {
    hasten_status s = fail(t->host, HASTEN_ERR_SYSTEM, t->path, strerror(errno));
    fclose(f);
    unlink(tmp);
    free(tmp);
    return s;
  }
  free(tmp);
  test_point("csv-rewrite-renamed");
  if (t->file) fclose(t->file);
  t->file = f;
  return HASTEN_OK;
}

static long find_column(const csv_tracker* t, const char* name) {
  size_t c;
  for (c = 0; c < t->n_columns; ++c)
    if (strcmp(t->columns[c], name) == 0) return (long)c;
  return -1;
}

/* Inserts a column in sorted position and widens every stored row. */
static int add_column(csv_tracker* t, const char* name) {
  size_t pos = 0, i;
  char** cols;
  char* copy = dup_string(name);
  if (!copy) return 0;
  while (pos < t->n_columns && strcmp(t->columns[pos], name) < 0) ++pos;
  cols = (char**)realloc(t->columns, (t->n_columns + 1) * sizeof(char*));
  if (!cols) { free(copy); return 0; }
  t->columns = cols;
  memmove(&cols[pos + 1], &cols[pos], (t->n_columns - pos) * sizeof(char*));
  cols[pos] = copy;
  t->n_columns++;
  for (i = 0; i < t->n_rows; ++i) {
    row_t* r = &t->rows[i];
    double* v = (double*)realloc(r->values, t->n_columns * sizeof(double));
    unsigned char* p;
    if (!v) return 0;
    r->values = v;
    p = (unsigned char*)realloc(r->present, t->n_columns);
    if (!p) return 0;
    r->present = p;
    memmove(&v[pos + 1], &v[pos], (r->n_values - pos) * sizeof(double));
    memmove(&p[pos + 1], &p[pos], r->n_values - pos);
    v[pos] = 0;
    p[pos] = 0;
    r->n_values = t->n_columns;
  }
  return 1;
}

static hasten_status csv_create(const hasten_host_api* host, const char* options_json,
                                hasten_instance** out) {
  csv_tracker* t;
  const char* p = options_json ? options_json : "{}";
  /* No options: the JSON must be an empty object. */
  while (*p == ' ' || *p == '\t' || *p == '\n') ++p;
  if (*p != '{') return fail(host, HASTEN_ERR_INVALID_ARGUMENT, "csv options must be a JSON object", options_json);
  ++p;
  while (*p == ' ' || *p == '\t' || *p == '\n') ++p;
  if (*p != '}') return fail(host, HASTEN_ERR_INVALID_ARGUMENT, "tracker 'csv' takes no options, got", options_json);
  t = (csv_tracker*)calloc(1, sizeof *t);
  if (!t) return fail(host, HASTEN_ERR_SYSTEM, "out of memory", NULL);
  t->host = host;
  *out = (hasten_instance*)t;
  return HASTEN_OK;
}

static void csv_destroy(hasten_instance* self) {
  csv_tracker* t = (csv_tracker*)self;
  size_t i;
  if (!t) return;
  if (t->file) fclose(t->file);
  for (i = 0; i < t->n_columns; ++i) free(t->columns[i]);
  for (i = 0; i < t->n_rows; ++i) {
    free(t->rows[i].values);
    free(t->rows[i].present);
  }
  free(t->columns);
  free(t->rows);
  free(t->path);
  free(t->info);
  free(t);
}

/* A run never overwrites an earlier run's files in the same logging directory: the first run
 * writes metrics.csv and hparams.json, later ones metrics-1.csv and hparams-1.json, -2, ...
 * (the first number whose two files are both new). Both are created exclusively ("x"), so two
 * runs starting together cannot take the same pair either. */
#define CSV_MAX_RUNS 100000

static hasten_status csv_start(hasten_instance* self, const hasten_tracker_run* run) {
  csv_tracker* t = (csv_tracker*)self;
  size_t n = strlen(run->logging_dir);
  FILE* h = NULL;
  char* hp;
  unsigned k;
  t->path = (char*)malloc(n + 40);
  hp = (char*)malloc(n + 40);
  if (!t->path || !hp) { free(hp); return fail(t->host, HASTEN_ERR_SYSTEM, "out of memory", NULL); }
  for (k = 0; k < CSV_MAX_RUNS; ++k) {
    if (k == 0) {
      sprintf(t->path, "%s/metrics.csv", run->logging_dir);
      sprintf(hp, "%s/hparams.json", run->logging_dir);
    } else {
      sprintf(t->path, "%s/metrics-%u.csv", run->logging_dir, k);
      sprintf(hp, "%s/hparams-%u.json", run->logging_dir, k);
    }
    t->file = fopen(t->path, "wx");
    if (!t->file && errno == EEXIST) continue;
    if (!t->file) break;
    h = fopen(hp, "wx");
    if (h || errno != EEXIST) break;
    fclose(t->file); /* an hparams file of another run: this number is taken */
    t->file = NULL;
    remove(t->path);
  }
  if (!t->file || !h) {
    const int err = errno;
    hasten_status s = fail(t->host, HASTEN_ERR_SYSTEM, k == CSV_MAX_RUNS ? run->logging_dir : (t->file ? hp : t->path),
                           k == CSV_MAX_RUNS ? "every metrics-N.csv name is taken" : strerror(err));
    if (t->file) {
      fclose(t->file);
      t->file = NULL;
      remove(t->path);
    }
    free(hp);
    return s;
  }
  fputs(run->hparams_json ? run->hparams_json : "{}", h);
  fputc('\n', h);
  fclose(h);
  free(hp);
  return rewrite(t);
}

static hasten_status csv_log_scalars(hasten_instance* self, const hasten_scalar* values, uint32_t n,
                                     int64_t step) {
  csv_tracker* t = (csv_tracker*)self;
  uint32_t i;
  int widened = 0;
  row_t* r;
  if (!t->file) return fail(t->host, HASTEN_ERR_INVALID_USAGE, "csv tracker: log before start", NULL);
  for (i = 0; i < n; ++i) {
    if (!values[i].name || !*values[i].name)
      return fail(t->host, HASTEN_ERR_INVALID_ARGUMENT, "csv tracker: a metric has no name", NULL);
    if (strcmp(values[i].name, "step") == 0)
      return fail(t->host, HASTEN_ERR_INVALID_ARGUMENT, "csv tracker: 'step' is reserved for the step column", NULL);
    if (find_column(t, values[i].name) < 0) {
      if (!add_column(t, values[i].name)) return fail(t->host, HASTEN_ERR_SYSTEM, "out of memory", NULL);
      widened = 1;
    }
  }
  if (t->n_rows == t->cap_rows) {
    size_t cap = t->cap_rows ? t->cap_rows * 2 : 64;
    row_t* rows = (row_t*)realloc(t->rows, cap * sizeof(row_t));
    if (!rows) return fail(t->host, HASTEN_ERR_SYSTEM, "out of memory", NULL);
    t->rows = rows;
    t->cap_rows = cap;
  }
  r = &t->rows[t->n_rows];
  r->step = step;
  r->n_values = t->n_columns;
  r->values = (double*)calloc(t->n_columns ? t->n_columns : 1, sizeof(double));
  r->present = (unsigned char*)calloc(t->n_columns ? t->n_columns : 1, 1);
  if (!r->values || !r->present) {
    free(r->values);
    free(r->present);
    return fail(t->host, HASTEN_ERR_SYSTEM, "out of memory", NULL);
  }
  for (i = 0; i < n; ++i) {
    long c = find_column(t, values[i].name);
    r->values[c] = values[i].value;
    r->present[c] = 1;
  }
  t->n_rows++;
  if (widened) return rewrite(t) == HASTEN_OK && fflush(t->file) == 0 ? HASTEN_OK
             : fail(t->host, HASTEN_ERR_SYSTEM, t->path, strerror(errno));
  write_row(t->file, t, r);
  if (fflush(t->file) != 0) return fail(t->host, HASTEN_ERR_SYSTEM, t->path, strerror(errno));
  return HASTEN_OK;
}

static hasten_status csv_flush(hasten_instance* self) {
  csv_tracker* t = (csv_tracker*)self;
  if (t->file && fflush(t->file) != 0) return fail(t->host, HASTEN_ERR_SYSTEM, t->path, strerror(errno));
  return HASTEN_OK;
}

static hasten_status csv_finish(hasten_instance* self, hasten_status status) {
  csv_tracker* t = (csv_tracker*)self;
  (void)status;
  if (t->file && fclose(t->file) != 0) {
    t->file = NULL;
    return fail(t->host, HASTEN_ERR_SYSTEM, t->path, strerror(errno));
  }
  t->file = NULL;
  return HASTEN_OK;
}

/* {"file": "<path>"}: the path escaped as a JSON string (quote, backslash, control bytes). */
static hasten_status csv_run_info(hasten_instance* self, const char** json_out) {
  csv_tracker* t = (csv_tracker*)self;
  const char* p;
  char* o;
  *json_out = NULL;
  if (!t->path) return HASTEN_OK;
  if (!t->info) {
    t->info = (char*)malloc(strlen(t->path) * 6 + 16);
    if (!t->info) return fail(t->host, HASTEN_ERR_SYSTEM, "out of memory", NULL);
    o = t->info + sprintf(t->info, "{\"file\":\"");
    for (p = t->path; *p; ++p) {
      const unsigned char c = (unsigned char)*p;
      if (c == '"' || c == '\\') { *o++ = '\\'; *o++ = (char)c; }
      else if (c < 0x20) o += sprintf(o, "\\u%04x", c);
      else *o++ = (char)c;
    }
    strcpy(o, "\"}");
  }
  *json_out = t->info;
  return HASTEN_OK;
}

static const hasten_tracker_vtable csv_vtable = {
    sizeof(hasten_tracker_vtable), HASTEN_ABI_VERSION,
    csv_create, csv_destroy, csv_start, csv_log_scalars, NULL, csv_flush, csv_finish,
    NULL, NULL, NULL,  /* 1.9: no images, histograms or tables */
    csv_run_info};

static const hasten_plugin_descriptor csv_descriptor = {
    sizeof(hasten_plugin_descriptor), HASTEN_ABI_VERSION, HASTEN_KIND_TRACKER, "csv", "1.0",
    "metrics.csv (step, then metrics alphabetically) and hparams.json; later runs metrics-N.csv",
    NULL, NULL, 0, &csv_vtable, NULL, 0, NULL, NULL};

static const hasten_plugin_descriptor* const csv_plugins[] = {&csv_descriptor};

HASTEN_PLUGIN_EXPORT hasten_status hasten_plugin_entry_v1(const hasten_host_api* host, uint32_t host_abi,
                                                          const hasten_plugin_descriptor* const** out,
                                                          uint32_t* count) {
  (void)host;
  if (HASTEN_ABI_VERSION_MAJOR(host_abi) != HASTEN_ABI_MAJOR) return HASTEN_ERR_UNSUPPORTED;
  *out = csv_plugins;
  *count = 1;
  return HASTEN_OK;
}
