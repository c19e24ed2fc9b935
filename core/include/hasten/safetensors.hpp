// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header size, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
// then the raw little-endian data. Loadable by the Python ecosystem.
#pragma once

#include <torch/types.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace hasten {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Writes tensors (moved to the CPU, made contiguous) atomically: a temporary file, then a
// rename. Throws hasten::Error with the path on failure.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Streams the file's bytes (header, then data) to `sink`, for writers that checksum or flush
// as they go. Throws hasten::Error for an unsupported dtype or a duplicate name.
void write_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                       const std::function<void(const void* data, size_t size)>& sink);
// Reads every tensor of a file. Throws hasten::Error naming the file and what is wrong.
NamedTensors load_safetensors(const std::string& path);

}  // namespace hasten
