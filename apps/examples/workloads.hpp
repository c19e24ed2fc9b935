// The benchmark workloads of docs/workloads.md, built exactly as the PyTorch peer
// (tests/integration/peers/peer_workloads.py) builds them, so that the same seed gives the
// same losses.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace hasten::workloads {

struct Spec {
  std::string name;
  int64_t batch;     // B, per process
  int64_t samples;   // N
  int64_t timed_steps;  // default S
};

// mlp-small, mlp-large, gpt-tiny; throws std::invalid_argument for other names.
const Spec& spec(const std::string& name);
std::vector<std::string> names();

// A model of a workload: forward(input) -> logits.
struct ModelImpl : torch::nn::Module {
  virtual torch::Tensor forward(torch::Tensor input) = 0;
};

// Sequential MLP: Linear/ReLU stack.
// With units = true every Linear (MLP) or encoder layer (gpt-tiny's CausalBlock) is a
// hasten::Unit, for sharding strategies; initialisation and numerics are unchanged.
struct MlpImpl : ModelImpl {
  MlpImpl(const std::vector<int64_t>& widths, bool units);
  torch::Tensor forward(torch::Tensor input) override;
  torch::nn::Sequential layers{nullptr};
};

// A post-norm TransformerEncoderLayer (same parameters, names and initialisation) whose forward
// is the one PyTorch's Python layer runs in training: self-attention with need_weights=False.
// LibTorch's C++ layer always asks its attention for the head-averaged weights (a sum over heads
// of every score matrix, then thrown away) and computes scores, softmax and product op by op;
// PyTorch 2.x's Python layer calls scaled_dot_product_attention (a fused kernel on the CPU too)
// and averages nothing. This block does what Python does, op for op, so that gpt-tiny costs the
// same and rounds the same as the peer's.
struct CausalBlockImpl : torch::nn::TransformerEncoderLayerImpl {
  using torch::nn::TransformerEncoderLayerImpl::TransformerEncoderLayerImpl;
  // src: (sequence, batch, d_model); mask: a float (sequence, sequence) matrix added to the
  // scores, or undefined for none.
  torch::Tensor forward(const torch::Tensor& src, const torch::Tensor& mask);
};
TORCH_MODULE(CausalBlock);

// Token and learned position embeddings, 4 post-norm encoder layers (CausalBlock) with a causal
// mask (sequence-first), a linear head. Layers are constructed one by one, as the peer does.
struct TinyGptImpl : ModelImpl {
  TinyGptImpl(int64_t vocab, int64_t seq, int64_t d_model, int64_t nhead, int64_t ff, int64_t layers, bool units);
  // Its parameter count without building it (one block is built, then dropped): a model built
  // sharded (sharded_init) holds only shards, and a full build would cost the memory it saves.
  static int64_t parameter_count(int64_t vocab, int64_t seq, int64_t d_model, int64_t nhead, int64_t ff,
                                 int64_t layers);
  torch::Tensor forward(torch::Tensor idx) override;  // idx: (seq, batch) int64
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  std::vector<std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>> block_calls;
  torch::nn::Linear head{nullptr};
  torch::Tensor causal_mask, positions;
};

// Call right after torch::manual_seed(0).
std::shared_ptr<ModelImpl> build_model(const std::string& name, bool units = false);

// The dataset, drawn right after the model from the same generator: (inputs, targets) with
// the sample dimension first. For gpt-tiny, inputs = tokens[:, :-1] and targets = tokens[:, 1:].
std::pair<torch::Tensor, torch::Tensor> build_data(const std::string& name);

// Model input and loss target for a batch of samples (gpt-tiny transposes to sequence-first).
torch::Tensor model_input(const std::string& name, const torch::Tensor& inputs);
torch::Tensor loss(const std::string& name, const torch::Tensor& logits, const torch::Tensor& targets);

torch::optim::AdamWOptions optimizer_options();

double peak_rss_mb();
// The process's resident memory now (VmRSS), in MiB.
double rss_mb();

}  // namespace hasten::workloads
