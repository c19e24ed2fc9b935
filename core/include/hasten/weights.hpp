// Model weights for other tools, in Hugging Face's layout: one model.safetensors, or shards
// model-0000k-of-0000n.safetensors with model.safetensors.index.json ({"metadata":
// {"total_size": bytes}, "weight_map": {name: shard file}}). Accelerator::save_model writes
// them from a prepared model (gathered one unit at a time); these read them back.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>

namespace hasten {

// Loads weights into a module's parameters and buffers by name, converting dtype: from a
// .safetensors file, a directory holding model.safetensors or model.safetensors.index.json,
// or a checkpoint directory of save_state. With strict, a name the module has and the files
// lack, or the reverse, is an error naming it; a shape that differs always is. Throws
// hasten::Error.
void load_weights(torch::nn::Module& module, const std::string& path, bool strict = true);

// Writes every tensor of the weights at `path` (as load_weights reads them) into one
// safetensors file `out` (`hasten merge-weights`). Throws hasten::Error.
void merge_weights(const std::string& path, const std::string& out);

// "10GB", "500MB", "2GiB", "1000" (bytes) -> bytes; throws hasten::Error naming the text.
uint64_t parse_size(const std::string& text);

}  // namespace hasten
