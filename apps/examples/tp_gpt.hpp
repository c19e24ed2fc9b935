// TinyGpt's tensor-parallel form (hasten/tensor_parallel.hpp): the plan that splits the char
// LM's model over a tp group. Made from the one-process model after it is built (so from the
// same initialisation), keeping this rank's part of each layer:
//   token embedding   vocabulary-parallel (rows)
//   attention         q, k and v column-parallel by heads, the output projection row-parallel
//   MLP               linear1 column-parallel, linear2 row-parallel
//   head              column-parallel over the vocabulary; the loss vocabulary-parallel
//   position embedding, layer norms, row-parallel biases: whole on every rank
// forward() returns this rank's logits (sequence, batch, vocab / tp); loss() their
// cross-entropy, the one-process model's loss on the same batch.
#pragma once

#include <hasten/tensor_parallel.hpp>

#include <torch/torch.h>

#include "workloads.hpp"

namespace hasten::workloads {

struct TpCausalBlockImpl : torch::nn::Module {
  TpCausalBlockImpl(const CausalBlock& whole, const hasten::ProcessGroup& tp);
  torch::Tensor forward(const torch::Tensor& src, const torch::Tensor& mask);
  hasten::tp::ColumnParallelLinear qkv{nullptr}, linear1{nullptr};
  hasten::tp::RowParallelLinear out_proj{nullptr}, linear2{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  int64_t local_heads = 0, head_dim = 0;
};
TORCH_MODULE(TpCausalBlock);

struct TpGptImpl : ModelImpl {
  TpGptImpl(const TinyGptImpl& whole, const hasten::ProcessGroup& tp);
  torch::Tensor forward(torch::Tensor idx) override;  // idx: (seq, batch) int64
  // The mean cross-entropy of forward's logits against targets (batch, seq).
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) const;
  // TinyGpt's name of one of this model's parameters: its whole state (get_state_dict) under
  // TinyGpt's names loads into the one-process model.
  static std::string whole_name(const std::string& name);
  hasten::tp::VocabParallelEmbedding tok{nullptr};
  torch::nn::Embedding pos{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  hasten::tp::ColumnParallelLinear head{nullptr};
  torch::Tensor causal_mask, positions;
  hasten::ProcessGroup group;
};
TORCH_MODULE(TpGpt);

}  // namespace hasten::workloads
