// TinyGpt's tensor-parallel form (hasten/tensor_parallel.hpp): the plan that splits the char
// LM's model over a tp group. Made from the one-process model after it is built (so from the
// same initialisation), keeping this rank's part of each layer:
//   token embedding   vocabulary-parallel (rows)
//   attention         q, k and v column-parallel by heads, the output projection row-parallel
//   MLP               linear1 column-parallel, linear2 row-parallel
//   head              column-parallel over the vocabulary; the loss vocabulary-parallel
//   position embedding, layer norms, row-parallel biases: whole on every rank
// Its parameters have TinyGpt's names, so its whole state (get_state_dict, checkpoints) is
// TinyGpt's: a tensor-parallel checkpoint loads into the one-process model and back.
// forward() returns this rank's logits (sequence, batch, vocab / tp); loss() their
// cross-entropy, the one-process model's loss on the same batch.
#pragma once

#include <hasten/tensor_parallel.hpp>

#include <torch/torch.h>

#include "workloads.hpp"

namespace hasten::workloads {

// The attention split by heads under MultiheadAttention's names: in_proj_weight and
// in_proj_bias hold this rank's heads of each of q, k and v (packed, so a checkpoint gathers
// them into the whole [q; k; v]), out_proj is row-parallel.
struct TpSelfAttentionImpl : torch::nn::Module, hasten::tp::SplitModule {
  TpSelfAttentionImpl(const torch::nn::MultiheadAttention& whole, const hasten::ProcessGroup& tp);
  // src (seq, batch, width), the same on every rank -> this rank's heads' q, k, v packed.
  torch::Tensor project(const torch::Tensor& src);
  std::vector<hasten::tp::SplitParameter> split_parameters() const override {
    return {{"in_proj_weight", 0, 3}, {"in_proj_bias", 0, 3}};
  }
  const hasten::ProcessGroup& split_group() const override { return group; }
  torch::Tensor in_proj_weight, in_proj_bias;
  hasten::tp::RowParallelLinear out_proj{nullptr};
  hasten::ProcessGroup group;
  int64_t local_heads = 0, head_dim = 0;
};
TORCH_MODULE(TpSelfAttention);

struct TpCausalBlockImpl : torch::nn::Module {
  TpCausalBlockImpl(const CausalBlock& whole, const hasten::ProcessGroup& tp);
  torch::Tensor forward(const torch::Tensor& src, const torch::Tensor& mask);
  TpSelfAttention self_attn{nullptr};
  hasten::tp::ColumnParallelLinear linear1{nullptr};
  hasten::tp::RowParallelLinear linear2{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
};
TORCH_MODULE(TpCausalBlock);

struct TpGptImpl : ModelImpl {
  TpGptImpl(const TinyGptImpl& whole, const hasten::ProcessGroup& tp);
  torch::Tensor forward(torch::Tensor idx) override;  // idx: (seq, batch) int64
  // The mean cross-entropy of forward's logits against targets (batch, seq).
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) const;
  hasten::tp::VocabParallelEmbedding tok{nullptr};
  torch::nn::Embedding pos{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  hasten::tp::ColumnParallelLinear head{nullptr};
  torch::Tensor causal_mask, positions;
  hasten::ProcessGroup group;
};
TORCH_MODULE(TpGpt);

}  // namespace hasten::workloads
