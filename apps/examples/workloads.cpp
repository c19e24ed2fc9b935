#include "workloads.hpp"

#include <hasten/unit.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace hasten::workloads {

namespace {
const std::vector<Spec>& specs() {
  static const std::vector<Spec> s = {
      {"mlp-small", 32, 8192, 200},
      {"mlp-large", 64, 4096, 50},
      {"gpt-tiny", 8, 2048, 200},
  };
  return s;
}
}  // namespace

const Spec& spec(const std::string& name) {
  for (auto& s : specs())
    if (s.name == name) return s;
  throw std::invalid_argument("unknown workload '" + name + "' (allowed: mlp-small, mlp-large, gpt-tiny)");
}

std::vector<std::string> names() { return {"mlp-small", "mlp-large", "gpt-tiny"}; }

MlpImpl::MlpImpl(const std::vector<int64_t>& widths, bool units) {
  layers = register_module("layers", torch::nn::Sequential());
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    if (units)
      layers->push_back(hasten::Unit<torch::nn::Linear>(widths[i], widths[i + 1]));
    else
      layers->push_back(torch::nn::Linear(widths[i], widths[i + 1]));
    if (i + 2 < widths.size()) layers->push_back(torch::nn::ReLU());
  }
}

torch::Tensor MlpImpl::forward(torch::Tensor input) { return layers->forward(input); }

torch::Tensor CausalBlockImpl::forward(const torch::Tensor& src, const torch::Tensor& mask) {
  namespace F = torch::nn::functional;
  // Python's F.multi_head_attention_forward for self-attention (q is k is v), need_weights=False,
  // as PyTorch 2.x runs it: the packed in-projection, then scaled_dot_product_attention.
  const int64_t len = src.size(0), batch = src.size(1), width = src.size(2);
  const int64_t heads = self_attn->options.num_heads(), head_dim = width / heads;
  // torch::linear (aten::linear, what Python's F.linear calls), not F::linear or Linear's
  // forward: for inputs of more than two dimensions LibTorch's C++ F::linear computes matmul
  // and then adds the bias, where aten::linear folds the bias into one addmm, which rounds
  // differently once the inner dimension spans several of the BLAS's blocks.
  // _in_projection_packed: (len, batch, 3 * width) -> (3, len, batch, width).
  const torch::Tensor proj = torch::linear(src, self_attn->in_proj_weight, self_attn->in_proj_bias)
                                 .unflatten(-1, {3, width})
                                 .unsqueeze(0)
                                 .transpose(0, -2)
                                 .squeeze(-2)
                                 .contiguous();
  auto heads_first = [&](const torch::Tensor& t) {
    return t.view({len, batch * heads, head_dim}).transpose(0, 1).view({batch, heads, len, head_dim});
  };
  // A (len, len) float mask broadcast over batch and heads, as Python's (1, 1, L, S).
  const torch::Tensor attn_mask = mask.defined() ? mask.unsqueeze(0).unsqueeze(0) : torch::Tensor();
  const double dropout_p = is_training() ? self_attn->options.dropout() : 0.0;
  torch::Tensor attn = at::scaled_dot_product_attention(heads_first(proj[0]), heads_first(proj[1]),
                                                        heads_first(proj[2]), attn_mask, dropout_p, false);
  attn = attn.permute({2, 0, 1, 3}).reshape({batch * len, width});
  attn = torch::linear(attn, self_attn->out_proj->weight, self_attn->out_proj->bias).view({len, batch, width});
  // Python's _sa_block and _ff_block, post-norm.
  const torch::Tensor x = norm1(src + dropout1(attn));
  torch::Tensor hidden = torch::linear(x, linear1->weight, linear1->bias);
  const auto& activation = options.activation();
  if (std::get_if<torch::enumtype::kGELU>(&activation) != nullptr)
    hidden = F::gelu(hidden);
  else if (const auto* fn = std::get_if<std::function<torch::Tensor(const torch::Tensor&)>>(&activation))
    hidden = (*fn)(hidden);
  else
    hidden = F::relu(hidden);
  return norm2(x + dropout2(torch::linear(dropout(hidden), linear2->weight, linear2->bias)));
}

TinyGptImpl::TinyGptImpl(int64_t vocab, int64_t seq, int64_t d_model, int64_t nhead, int64_t ff,
                         int64_t layers, bool units) {
  tok = register_module("tok", torch::nn::Embedding(vocab, d_model));
  pos = register_module("pos", torch::nn::Embedding(seq, d_model));
  blocks = register_module("layers", torch::nn::ModuleList());
  const auto options =
      torch::nn::TransformerEncoderLayerOptions(d_model, nhead).dim_feedforward(ff).dropout(0.0).activation(torch::kReLU);
  for (int64_t i = 0; i < layers; ++i) {
    if (units) {
      hasten::Unit<CausalBlock> layer(options);
      blocks->push_back(layer.ptr());
      block_calls.push_back([layer](const torch::Tensor& h, const torch::Tensor& m) mutable { return layer->forward(h, m); });
    } else {
      CausalBlock layer(options);
      blocks->push_back(layer.ptr());
      block_calls.push_back([layer](const torch::Tensor& h, const torch::Tensor& m) mutable { return layer->forward(h, m); });
    }
  }
  head = register_module("head", torch::nn::Linear(d_model, vocab));
  // Plain tensors, not buffers (the peer keeps them out of DDP's buffer broadcast); forward
  // moves them to the device of its input, so the model runs wherever it was moved.
  causal_mask = torch::triu(torch::full({seq, seq}, -std::numeric_limits<float>::infinity()), 1);
  positions = torch::arange(seq);
}

int64_t TinyGptImpl::parameter_count(int64_t vocab, int64_t seq, int64_t d_model, int64_t nhead, int64_t ff,
                                     int64_t layers) {
  CausalBlock block(
      torch::nn::TransformerEncoderLayerOptions(d_model, nhead).dim_feedforward(ff).dropout(0.0).activation(torch::kReLU));
  int64_t per_block = 0;
  for (const auto& p : block->parameters()) per_block += p.numel();
  // tok and pos embeddings, the blocks, the head's weight and bias.
  return (vocab + seq) * d_model + layers * per_block + d_model * vocab + vocab;
}

torch::Tensor TinyGptImpl::forward(torch::Tensor idx) {
  const int64_t s = idx.size(0);
  if (positions.device() != idx.device()) {
    causal_mask = causal_mask.to(idx.device());
    positions = positions.to(idx.device());
  }
  torch::Tensor h = tok->forward(idx) + pos->forward(positions.narrow(0, 0, s)).unsqueeze(1);
  const torch::Tensor mask = causal_mask.narrow(0, 0, s).narrow(1, 0, s);
  for (auto& block : block_calls) h = block(h, mask);
  return torch::linear(h, head->weight, head->bias);  // aten::linear, as in CausalBlockImpl::forward
}

std::shared_ptr<ModelImpl> build_model(const std::string& name, bool units) {
  spec(name);
  if (name == "mlp-small") return std::make_shared<MlpImpl>(std::vector<int64_t>{256, 512, 512, 10}, units);
  if (name == "mlp-large")
    return std::make_shared<MlpImpl>(std::vector<int64_t>{1024, 4096, 4096, 1024, 10}, units);
  return std::make_shared<TinyGptImpl>(96, 128, 256, 4, 1024, 4, units);
}

std::pair<torch::Tensor, torch::Tensor> build_data(const std::string& name) {
  const Spec& s = spec(name);
  if (name == "gpt-tiny") {
    torch::Tensor tokens = torch::randint(0, 96, {s.samples, 129}, torch::kLong);
    return {tokens.narrow(1, 0, 128), tokens.narrow(1, 1, 128)};
  }
  const int64_t in = name == "mlp-small" ? 256 : 1024;
  torch::Tensor x = torch::randn({s.samples, in});
  torch::Tensor y = torch::randint(0, 10, {s.samples}, torch::kLong);
  return {x, y};
}

torch::Tensor model_input(const std::string& name, const torch::Tensor& inputs) {
  return name == "gpt-tiny" ? inputs.t() : inputs;
}

torch::Tensor loss(const std::string& name, const torch::Tensor& logits, const torch::Tensor& targets) {
  namespace F = torch::nn::functional;
  if (name == "gpt-tiny")
    return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.t().reshape(-1));
  return F::cross_entropy(logits, targets);
}

torch::optim::AdamWOptions optimizer_options() {
  return torch::optim::AdamWOptions(1e-3).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.01);
}

double peak_rss_mb() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

double rss_mb() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

}  // namespace hasten::workloads
