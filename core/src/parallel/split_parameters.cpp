// Split parameters' wholes and parts (split_parameters.hpp). A packed parameter (q, k and v in
// one projection) is `packed` wholes side by side along dim, each split over the group: member
// r holds [q_r, k_r, v_r], so the whole is rebuilt chunk by chunk, not by concatenating the
// members' parts.
#include "parallel/split_parameters.hpp"

#include <hasten/error.hpp>
#include <hasten/tensor_parallel.hpp>

#include <torch/torch.h>

#include <cmath>

namespace hasten::detail {

SplitLayouts split_layouts(torch::nn::Module& model) {
  SplitLayouts out;
  for (const auto& item : model.named_modules()) {
    const auto* split = dynamic_cast<const tp::SplitModule*>(item.value().get());
    if (split == nullptr) continue;
    const ProcessGroup& group = split->split_group();
    if (group.size() == 1) continue;
    for (const auto& p : split->split_parameters()) {
      const std::string name = item.key().empty() ? p.name : item.key() + "." + p.name;
      out[name] = SplitLayout{group.name(), group.rank(), group.size(), p.dim, p.packed};
    }
  }
  return out;
}

std::vector<int64_t> whole_shape(c10::IntArrayRef part, const SplitLayout& layout) {
  std::vector<int64_t> shape = part.vec();
  shape.at(static_cast<size_t>(layout.dim)) *= layout.size;
  return shape;
}

torch::Tensor gather_whole(Engine& engine, const torch::Tensor& part, const SplitLayout& layout) {
  // all_gather concatenates along dim 0: the members' parts, each moved to dim 0 first.
  const torch::Tensor mine = part.detach().movedim(layout.dim, 0).contiguous();
  const torch::Tensor all = engine.group_all_gather(layout.group, mine);
  std::vector<torch::Tensor> members = all.chunk(layout.size, 0);
  std::vector<torch::Tensor> pieces;  // chunk c of every member, in rank order, for each c
  for (int64_t c = 0; c < layout.packed; ++c)
    for (const auto& m : members) pieces.push_back(m.chunk(layout.packed, 0)[static_cast<size_t>(c)]);
  return torch::cat(pieces, 0).movedim(0, layout.dim).contiguous();
}

torch::Tensor cut_part(const torch::Tensor& whole, c10::IntArrayRef part_shape, const SplitLayout& layout,
                       const std::string& what) {
  const std::vector<int64_t> expected = whole_shape(part_shape, layout);
  if (whole.sizes() != c10::IntArrayRef(expected))
    throw Error(what + " has shape " + c10::str(whole.sizes()) + ", but this model's part " + c10::str(part_shape) +
                " is 1/" + std::to_string(layout.size) + " of a whole of shape " + c10::str(c10::IntArrayRef(expected)));
  const int64_t step = part_shape[static_cast<size_t>(layout.dim)] / layout.packed;
  std::vector<torch::Tensor> pieces;
  for (const auto& chunk : whole.chunk(layout.packed, layout.dim))
    pieces.push_back(chunk.narrow(layout.dim, layout.rank * step, step));
  return torch::cat(pieces, layout.dim).contiguous();
}

double clip_split_grad_norm(Engine& engine, const std::vector<torch::Tensor>& parameters,
                            const std::map<const void*, SplitLayout>& split, double max_norm, double norm_type) {
  // The group comes from the layouts, which every rank has alike (not from which parameters
  // have gradients here): every member takes part in the one all-reduce below.
  std::string group;
  for (const auto& [impl, layout] : split) {
    if (!group.empty() && group != layout.group)
      throw UsageError("clip_grad_norm_: the parameters are split over more than one group ('" + group + "', '" +
                       layout.group + "'), whose norms hasten does not combine");
    group = layout.group;
  }
  const bool inf = std::isinf(norm_type);
  // [replicated, parts] in double: |g|^p summed (or max |g|); one host read at the end.
  torch::Tensor sums = torch::zeros({2}, torch::kDouble);
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters) {
    if (!p.grad().defined() || p.grad().numel() == 0) continue;
    grads.push_back(p.grad());
    const torch::Tensor g = p.grad().detach().to(torch::kCPU, torch::kDouble).abs();
    const torch::Tensor v = inf ? g.max() : g.pow(norm_type).sum();
    const int64_t k = split.count(p.unsafeGetTensorImpl()) ? 1 : 0;
    sums[k].copy_(inf ? torch::maximum(sums[k], v) : sums[k] + v);
  }
  torch::Tensor parts = sums.narrow(0, 1, 1).clone();
  if (!group.empty()) engine.group_all_reduce_(group, parts, inf ? ReduceOp::Max : ReduceOp::Sum);
  const double replicated = sums[0].item<double>(), split_sum = parts.item<double>();
  const double total = inf ? std::max(replicated, split_sum) : std::pow(replicated + split_sum, 1.0 / norm_type);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0)
    for (auto& g : grads) g.mul_(coef);
  return total;
}

}  // namespace hasten::detail
