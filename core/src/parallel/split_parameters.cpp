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
    throw Error(what + " has shape " + c10::str(whole.sizes()) + "; split over " + std::to_string(layout.size) +
                " ranks as this model's part " + c10::str(part_shape) + " is, the whole is " +
                c10::str(c10::IntArrayRef(expected)));
  const int64_t step = part_shape[static_cast<size_t>(layout.dim)] / layout.packed;
  std::vector<torch::Tensor> pieces;
  for (const auto& chunk : whole.chunk(layout.packed, layout.dim))
    pieces.push_back(chunk.narrow(layout.dim, layout.rank * step, step));
  return torch::cat(pieces, layout.dim).contiguous();
}

double clip_split_grad_norm(Engine& engine, const std::vector<torch::Tensor>& parameters,
                            const std::map<const void*, SplitLayout>& split, double max_norm, double norm_type) {
  const bool inf = std::isinf(norm_type);
  // [replicated, parts] in double: |g|^p summed (or max |g|), each part once per member.
  double replicated = 0, parts = 0;
  std::string group;
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters) {
    if (!p.grad().defined()) continue;
    grads.push_back(p.grad());
    const auto it = split.find(p.unsafeGetTensorImpl());
    const torch::Tensor g = p.grad().detach().to(torch::kDouble);
    const double v = inf ? g.abs().max().item<double>() : g.abs().pow(norm_type).sum().item<double>();
    double& into = it == split.end() ? replicated : parts;
    into = inf ? std::max(into, v) : into + v;
    if (it == split.end()) continue;
    if (!group.empty() && group != it->second.group)
      throw UsageError("clip_grad_norm_: the parameters are split over more than one group ('" + group + "', '" +
                       it->second.group + "'), whose norms hasten does not combine");
    group = it->second.group;
  }
  if (!group.empty()) {
    torch::Tensor t = torch::tensor({parts}, torch::kDouble);
    engine.group_all_reduce_(group, t, inf ? ReduceOp::Max : ReduceOp::Sum);
    parts = t.item<double>();
  }
  const double total = inf ? std::max(replicated, parts) : std::pow(replicated + parts, 1.0 / norm_type);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0)
    for (auto& g : grads) g.mul_(coef);
  return total;
}

}  // namespace hasten::detail
