// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header size, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
// then the raw little-endian data. Loadable by the Python ecosystem.
//
// Dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8 and BOOL. Reading checks the file
// against the format's rules before it reads any data (header size within the file and at
// most 100 MB, a JSON object without duplicate keys, known dtypes, non-negative shapes whose
// byte size fits 64 bits and equals the entry's data_offsets, data_offsets that cover the
// data region exactly: no hole, no overlap, nothing past the end, nothing left over) and
// refuses a file that breaks one with a hasten::Error naming the file and the rule.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace hasten {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// One tensor as a file's header describes it.
struct SafetensorsEntry {
  std::string name;
  torch::ScalarType dtype = torch::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the first byte after the header
  uint64_t end = 0;
};

// A file's validated header.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in the order of their data in the file
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // the file offset of the data region: 8 + the header size
};

// The largest header accepted, as in the reference implementation: it bounds what a file can
// make a reader allocate before anything about it is known.
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Writes tensors (moved to the CPU, made contiguous) atomically: a temporary file, then a
// rename. Throws hasten::Error with the path on failure.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Streams the file's bytes (header, then data) to `sink`, for writers that checksum or flush
// as they go; the data is written in the order of `tensors`, one tensor at a time. Throws
// hasten::Error for an unsupported dtype or layout, a duplicate name, the reserved name
// "__metadata__" or a name or metadata text that is not UTF-8.
void write_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                       const std::function<void(const void* data, size_t size)>& sink);

// Reads and validates a file's header without reading its data.
SafetensorsHeader read_safetensors_header(const std::string& path);

// Reads every tensor of a file (CPU tensors, in the order of their data), each straight into
// its own storage: peak memory is the tensors themselves, not a copy of the file besides.
// Throws hasten::Error naming the file and what is wrong.
NamedTensors load_safetensors(const std::string& path);

}  // namespace hasten
