/*
 * Optional for strategy libraries: readers of a strategy's own config file format (DeepSpeed's
 * JSON for "zero"), so that the plugin that owns the vocabulary translates it and the host
 * only routes files to it. A library that has readers exports, besides its entry point,
 *
 *   HASTEN_PLUGIN_EXPORT hasten_status hasten_config_file_readers_v1(
 *       const hasten_host_api* host, uint32_t host_abi,
 *       const hasten_config_file_reader* const** out, uint32_t* count);
 *
 * which the host calls once after the entry point. A library without the symbol has none; a
 * host older than this header never looks for it. The host routes two kinds of file:
 *
 * - the config file itself (`--config_file F`, HASTEN_CONFIG_FILE): before reading it as
 *   YAML, the host offers it to every reader; the first that recognizes it translates it;
 * - the key `<config_section>.<section_key>` of the reader's strategy in any config source:
 *   the file it names is translated and its keys join that source (a key both set differently
 *   is an error); the key itself goes no further (the strategy never sees it).
 */
#ifndef HASTEN_PLUGIN_CONFIG_FILE_H
#define HASTEN_PLUGIN_CONFIG_FILE_H

#include <hasten/plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HASTEN_CONFIG_FILE_READERS_V1_SYMBOL "hasten_config_file_readers_v1"

typedef struct hasten_config_file_reader {
  HASTEN_STRUCT_HEADER;
  const char* strategy;    /* static: a strategy plugin this library declares ("zero")        */
  const char* format;      /* static: how messages name the format ("DeepSpeed JSON")          */
  const char* section_key; /* static: the key of the strategy's config section that names a
                            * file in this format ("deepspeed_config_file"); NULL: none       */
  /* Required. Reads `path` (borrowed). A file not in this format: *recognized = 0, return OK,
   * emit nothing. Otherwise *recognized = 1 and emit(ctx, json) once with a JSON object of
   * config keys, hasten's and Accelerate's (mixed_precision, gradient_accumulation_steps,
   * precision_options, distributed_type, <config_section>: {...}); a value the format leaves
   * to the run ("auto") is left out. A key of the file the plugin does not implement is named
   * in one warning (host->log); one whose omission would change the result is an error
   * (set_error, non-OK status). */
  hasten_status (*read)(const hasten_host_api* host, const char* path, int32_t* recognized,
                        void (*emit)(void* ctx, const char* config_json), void* ctx);
} hasten_config_file_reader;

typedef hasten_status (*hasten_config_file_readers_v1_fn)(const hasten_host_api* host, uint32_t host_abi,
                                                          const hasten_config_file_reader* const** out,
                                                          uint32_t* count);

#ifdef __cplusplus
}
#endif

#endif /* HASTEN_PLUGIN_CONFIG_FILE_H */
