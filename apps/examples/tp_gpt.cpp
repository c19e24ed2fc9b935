#include "tp_gpt.hpp"

namespace hasten::workloads {

namespace {

// Rows [begin, end) of each of the packed projection's q, k and v, concatenated.
torch::Tensor packed_rows(const torch::Tensor& packed, int64_t width, int64_t begin, int64_t end) {
  std::vector<torch::Tensor> parts;
  for (int64_t i = 0; i < 3; ++i) parts.push_back(packed.detach().narrow(0, i * width + begin, end - begin));
  return torch::cat(parts);
}

}  // namespace

TpSelfAttentionImpl::TpSelfAttentionImpl(const torch::nn::MultiheadAttention& whole, const hasten::ProcessGroup& tp)
    : group(tp) {
  const int64_t width = whole->options.embed_dim(), heads = whole->options.num_heads();
  head_dim = width / heads;
  const auto [h0, h1] = hasten::tp::part_of(heads, tp, "the attention heads");
  local_heads = h1 - h0;
  torch::NoGradGuard no_grad;
  in_proj_weight = register_parameter("in_proj_weight",
                                      packed_rows(whole->in_proj_weight, width, h0 * head_dim, h1 * head_dim));
  in_proj_bias = register_parameter("in_proj_bias", packed_rows(whole->in_proj_bias, width, h0 * head_dim, h1 * head_dim));
  out_proj = register_module("out_proj", hasten::tp::RowParallelLinear(whole->out_proj, tp));
}

torch::Tensor TpSelfAttentionImpl::project(const torch::Tensor& src) {
  return torch::linear(hasten::tp::copy_to_group(src, group), in_proj_weight, in_proj_bias);
}

TpCausalBlockImpl::TpCausalBlockImpl(const CausalBlock& whole, const hasten::ProcessGroup& tp) {
  self_attn = register_module("self_attn", TpSelfAttention(whole->self_attn, tp));
  linear1 = register_module("linear1", hasten::tp::ColumnParallelLinear(whole->linear1, tp));
  linear2 = register_module("linear2", hasten::tp::RowParallelLinear(whole->linear2, tp));
  norm1 = register_module("norm1", whole->norm1);  // whole on every rank: shared with the model made from
  norm2 = register_module("norm2", whole->norm2);
}

torch::Tensor TpCausalBlockImpl::forward(const torch::Tensor& src, const torch::Tensor& mask) {
  // CausalBlockImpl::forward's arithmetic on this rank's heads (workloads.cpp), the output
  // projection's sum over the group in out_proj.
  const int64_t len = src.size(0), batch = src.size(1);
  const int64_t heads = self_attn->local_heads, head_dim = self_attn->head_dim, width = heads * head_dim;
  const torch::Tensor proj =
      self_attn->project(src).unflatten(-1, {3, width}).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous();
  auto heads_first = [&](const torch::Tensor& t) {
    return t.view({len, batch * heads, head_dim}).transpose(0, 1).view({batch, heads, len, head_dim});
  };
  const torch::Tensor attn_mask = mask.defined() ? mask.unsqueeze(0).unsqueeze(0) : torch::Tensor();
  torch::Tensor attn =
      at::scaled_dot_product_attention(heads_first(proj[0]), heads_first(proj[1]), heads_first(proj[2]), attn_mask, 0.0, false);
  attn = attn.permute({2, 0, 1, 3}).reshape({batch * len, width});
  attn = self_attn->out_proj(attn).view({len, batch, -1});
  const torch::Tensor x = norm1(src + attn);
  return norm2(x + linear2(torch::relu(linear1(x))));
}

TpGptImpl::TpGptImpl(const TinyGptImpl& whole, const hasten::ProcessGroup& tp) : group(tp) {
  tok = register_module("tok", hasten::tp::VocabParallelEmbedding(whole.tok, tp));
  pos = register_module("pos", whole.pos);
  blocks = register_module("layers", torch::nn::ModuleList());
  for (const auto& b : *whole.blocks) {
    auto block = std::dynamic_pointer_cast<CausalBlockImpl>(b);
    if (!block) throw std::invalid_argument("TpGpt: the model's layers must be plain CausalBlocks (built without units)");
    blocks->push_back(TpCausalBlock(CausalBlock(block), tp));
  }
  head = register_module("head", hasten::tp::ColumnParallelLinear(whole.head, tp));
  causal_mask = whole.causal_mask;
  positions = whole.positions;
}

torch::Tensor TpGptImpl::forward(torch::Tensor idx) {
  const int64_t s = idx.size(0);
  if (positions.device() != idx.device()) {
    causal_mask = causal_mask.to(idx.device());
    positions = positions.to(idx.device());
  }
  torch::Tensor h = tok(idx) + pos->forward(positions.narrow(0, 0, s)).unsqueeze(1);
  const torch::Tensor mask = causal_mask.narrow(0, 0, s).narrow(1, 0, s);
  for (const auto& b : *blocks) h = b->as<TpCausalBlockImpl>()->forward(h, mask);
  return head(h);
}

torch::Tensor TpGptImpl::loss(const torch::Tensor& logits, const torch::Tensor& targets) const {
  return hasten::tp::vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.t().reshape(-1), group);
}

}  // namespace hasten::workloads
