// Tensor parallelism, Megatron-LM's way, over a ProcessGroup of the device mesh (usually
// acc.device_mesh().group("tp")): each layer's matrices are split over the group's ranks, and
// the layers' forward and backward exchange exactly what the split needs.
//
// - ColumnParallelLinear: this rank's rows of the weight (output features); its input is the
//   whole activation, its output this rank's slice of the features.
// - RowParallelLinear: this rank's columns of the weight (input features); its input is a
//   column-parallel layer's slice, its output the whole activation (summed over the group).
// - VocabParallelEmbedding: this rank's rows of the table (a slice of the vocabulary).
// - vocab_parallel_cross_entropy: the loss of logits split over the vocabulary, without
//   gathering them.
// A transformer block splits its attention heads over the group (q, k, v column-parallel, the
// output projection row-parallel) and its MLP column-then-row: two all-reduces forward, two
// backward. Each layer is made from the whole layer of the one-process model (the same
// initialisation), keeping only its part, so a tensor-parallel model trains what the
// one-process model trains (apps/examples: TinyGpt's tensor-parallel form).
//
// Every rank of the group holds the same inputs (the same batch: the data loader shards over
// the mesh's `dp` group, not over tp) and computes the same replicated parameters' gradients.
//
// Checkpoints hold whole tensors: each layer says how its parameters split (SplitModule), so
// save_state, save_model and get_state_dict gather them over the group, and load_state cuts
// each rank's part of them, whatever tp size wrote them (1 included).
#pragma once

#include <hasten/device_mesh.hpp>

#include <ATen/core/Reduction.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace hasten::tp {

// One parameter of a SplitModule, by its name in that module: the module holds member
// rank()'s part of the whole along `dim`, 1/size() of it. With `packed` > 1 the whole is
// `packed` tensors concatenated along `dim` (q, k and v in one projection) and the part is
// this member's part of each, concatenated in the same order.
struct SplitParameter {
  std::string name;
  int64_t dim = 0;
  int64_t packed = 1;
};

// A module whose parameters are parts of whole ones split over a group. The Accelerator finds
// these among a prepared model's modules to write checkpoints whole and load them on another
// tp size; a user's own tensor-parallel layer implements it to take part. Parameters it does
// not list are whole on every member (and equal across the group).
class SplitModule {
 public:
  virtual ~SplitModule() = default;
  virtual std::vector<SplitParameter> split_parameters() const = 0;
  virtual const ProcessGroup& split_group() const = 0;
};

// Forward: x itself; backward: the gradient summed over the group (before a column-parallel
// layer: each rank's part of the input's gradient).
torch::Tensor copy_to_group(const torch::Tensor& x, const ProcessGroup& group);
// Forward: x summed over the group; backward: the gradient itself (after a row-parallel layer).
torch::Tensor reduce_from_group(const torch::Tensor& x, const ProcessGroup& group);

// [begin, end) of this member's part of `n` things (n divisible by the group's size, else
// UsageError naming `what`).
std::pair<int64_t, int64_t> part_of(int64_t n, const ProcessGroup& group, const std::string& what);

class ColumnParallelLinearImpl : public torch::nn::Module, public SplitModule {
 public:
  // This member's rows of `whole` (out_features / size of them) and of its bias.
  ColumnParallelLinearImpl(const torch::nn::Linear& whole, ProcessGroup group);
  // This member's part, cut by the caller: for a projection of `packed` matrices in one (q, k
  // and v: 3) each is cut apart, then the parts concatenated. Copied; bias may be undefined.
  ColumnParallelLinearImpl(const torch::Tensor& local_weight, const torch::Tensor& local_bias, ProcessGroup group,
                           int64_t packed = 1);
  // x: (..., in_features), the same on every member -> (..., out_features / size).
  torch::Tensor forward(const torch::Tensor& x);
  std::vector<SplitParameter> split_parameters() const override;
  const ProcessGroup& split_group() const override { return group_; }
  torch::Tensor weight, bias;

 private:
  ProcessGroup group_;
  int64_t packed_ = 1;
};
TORCH_MODULE(ColumnParallelLinear);

class RowParallelLinearImpl : public torch::nn::Module, public SplitModule {
 public:
  // This member's columns of `whole` (in_features / size of them); the bias whole.
  RowParallelLinearImpl(const torch::nn::Linear& whole, ProcessGroup group);
  // x: (..., in_features / size), this member's slice -> (..., out_features), the same on every
  // member.
  torch::Tensor forward(const torch::Tensor& x);
  std::vector<SplitParameter> split_parameters() const override { return {{"weight", 1}}; }  // bias whole
  const ProcessGroup& split_group() const override { return group_; }
  torch::Tensor weight, bias;

 private:
  ProcessGroup group_;
};
TORCH_MODULE(RowParallelLinear);

class VocabParallelEmbeddingImpl : public torch::nn::Module, public SplitModule {
 public:
  // This member's rows of `whole` (num_embeddings / size of them).
  VocabParallelEmbeddingImpl(const torch::nn::Embedding& whole, ProcessGroup group);
  // ids: any shape of int64 in [0, num_embeddings) -> (..., embedding_dim), the same on every
  // member.
  torch::Tensor forward(const torch::Tensor& ids);
  std::vector<SplitParameter> split_parameters() const override { return {{"weight", 0}}; }
  const ProcessGroup& split_group() const override { return group_; }
  torch::Tensor weight;
  int64_t vocab_begin = 0, vocab_end = 0;

 private:
  ProcessGroup group_;
};
TORCH_MODULE(VocabParallelEmbedding);

// The cross-entropy of logits split over the vocabulary: logits (N, vocab / size), this
// member's columns [begin, begin + vocab / size); target (N) in [0, vocab). Reduced as
// LibTorch's cross_entropy reduces (Mean, Sum, or None: the N losses). The same value on every
// member; each member's gradient reaches only its own columns.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                           const ProcessGroup& group,
                                           at::Reduction::Reduction reduction = at::Reduction::Mean);

}  // namespace hasten::tp
