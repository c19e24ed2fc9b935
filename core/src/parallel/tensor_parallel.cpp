// Tensor parallelism's communication and layers (tensor_parallel.hpp). The communication is
// autograd-aware without custom autograd functions: a gradient hook for copy_to_group, and for
// the forward collectives a value that autograd sees as the input itself. `r + (x - x.detach())`
// is r exactly (x - x.detach() is +0 for finite x) and passes the gradient to x unchanged.
#include <hasten/error.hpp>
#include <hasten/tensor_parallel.hpp>

#include <torch/torch.h>

namespace hasten::tp {

namespace {

// r's value, with autograd's identity path back to x (see the file's head).
torch::Tensor with_identity_gradient(const torch::Tensor& r, const torch::Tensor& x) {
  return x.requires_grad() ? r + (x - x.detach()) : r;
}

}  // namespace

torch::Tensor copy_to_group(const torch::Tensor& x, const ProcessGroup& group) {
  if (group.size() == 1 || !x.requires_grad()) return x;
  torch::Tensor y = x.view_as(x);
  y.register_hook([group](torch::Tensor grad) {
    torch::Tensor sum = grad.contiguous().clone();
    group.all_reduce_(sum);
    return sum;
  });
  return y;
}

torch::Tensor reduce_from_group(const torch::Tensor& x, const ProcessGroup& group) {
  if (group.size() == 1) return x;
  torch::Tensor r = x.detach().contiguous().clone();
  group.all_reduce_(r);
  return with_identity_gradient(r, x);
}

std::pair<int64_t, int64_t> part_of(int64_t n, const ProcessGroup& group, const std::string& what) {
  const int64_t size = group.size();
  if (n % size != 0)
    throw UsageError("tensor parallel: " + what + " (" + std::to_string(n) + ") does not split over the " +
                     std::to_string(size) + " ranks of group '" + group.name() + "' (it must be a multiple of " +
                     std::to_string(size) + ")");
  const int64_t k = n / size;
  return {group.rank() * k, (group.rank() + 1) * k};
}

namespace {
torch::Tensor rows_of(const torch::Tensor& t, const ProcessGroup& group, const char* what) {
  if (!t.defined()) return t;
  const auto [begin, end] = part_of(t.size(0), group, what);
  return t.detach().narrow(0, begin, end - begin);
}
}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::nn::Linear& whole, ProcessGroup group)
    : ColumnParallelLinearImpl(rows_of(whole->weight, group, "a column-parallel layer's output features"),
                               rows_of(whole->bias, group, "a column-parallel layer's output features"), group) {}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::Tensor& w, const torch::Tensor& b, ProcessGroup group,
                                                   int64_t packed)
    : group_(std::move(group)), packed_(packed) {
  if (packed < 1 || w.size(0) % packed != 0)
    throw UsageError("ColumnParallelLinear: a part of " + std::to_string(w.size(0)) + " rows does not hold " +
                     std::to_string(packed) + " packed matrices");
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", w.detach().contiguous().clone());
  if (b.defined()) bias = register_parameter("bias", b.detach().contiguous().clone());
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  return torch::linear(copy_to_group(x, group_), weight, bias);
}

std::vector<SplitParameter> ColumnParallelLinearImpl::split_parameters() const {
  std::vector<SplitParameter> out{{"weight", 0, packed_}};
  if (bias.defined()) out.push_back({"bias", 0, packed_});
  return out;
}

RowParallelLinearImpl::RowParallelLinearImpl(const torch::nn::Linear& whole, ProcessGroup group)
    : group_(std::move(group)) {
  const auto [begin, end] = part_of(whole->weight.size(1), group_, "a row-parallel layer's input features");
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", whole->weight.detach().narrow(1, begin, end - begin).contiguous().clone());
  if (whole->bias.defined()) bias = register_parameter("bias", whole->bias.detach().clone());
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = reduce_from_group(torch::linear(x, weight), group_);
  return bias.defined() ? y + bias : y;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::nn::Embedding& whole, ProcessGroup group)
    : group_(std::move(group)) {
  std::tie(vocab_begin, vocab_end) = part_of(whole->weight.size(0), group_, "an embedding's vocabulary");
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", whole->weight.detach().narrow(0, vocab_begin, vocab_end - vocab_begin).clone());
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  const torch::Tensor outside = (ids < vocab_begin).logical_or(ids >= vocab_end);
  const torch::Tensor local = (ids - vocab_begin).masked_fill(outside, 0);
  torch::Tensor rows = torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_from_group(rows, group_);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                           const ProcessGroup& group, at::Reduction::Reduction reduction) {
  if (logits.dim() != 2 || target.dim() != 1 || logits.size(0) != target.size(0))
    throw UsageError("vocab_parallel_cross_entropy: logits must be (N, vocab / " + std::to_string(group.size()) +
                     ") and target (N)");
  const int64_t part = logits.size(1), begin = group.rank() * part;
  // log(sum exp(x - m)) - (x_target - m), the whole vocabulary's max m and sum over the group.
  torch::Tensor max = std::get<0>(logits.detach().max(1)).contiguous();
  group.all_reduce_(max, ReduceOp::Max);
  const torch::Tensor shifted = logits - max.unsqueeze(1);
  const torch::Tensor sum_exp = reduce_from_group(shifted.exp().sum(1), group);
  const torch::Tensor mine = (target >= begin).logical_and(target < begin + part);
  const torch::Tensor column = (target - begin).clamp(0, part - 1).unsqueeze(1);
  const torch::Tensor picked = shifted.gather(1, column).squeeze(1).masked_fill(mine.logical_not(), 0.0);
  const torch::Tensor losses = sum_exp.log() - reduce_from_group(picked, group);
  switch (reduction) {
    case at::Reduction::None:
      return losses;
    case at::Reduction::Sum:
      return losses.sum();
    default:
      return losses.mean();
  }
}

}  // namespace hasten::tp
