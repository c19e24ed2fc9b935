// Tensor-parallel parameters in state dicts and checkpoints: which of a prepared model's
// parameters are parts of whole ones (the hasten::tp::SplitModule layers among its modules),
// gathering a part's whole over its group, and cutting a rank's part out of a whole. A
// checkpoint holds wholes, so it loads on any tp size.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

namespace hasten::detail {

class Engine;

struct SplitLayout {
  std::string group;  // the mesh group the parameter is split over
  int rank = 0, size = 1;
  int64_t dim = 0, packed = 1;
};
// By the parameter's name in the model (as named_parameters() gives it).
using SplitLayouts = std::map<std::string, SplitLayout>;

// The model's split parameters whose group has more than one member (a layer made over a
// group of one holds its whole).
SplitLayouts split_layouts(torch::nn::Module& model);

// Whether any of the models (entries with a `module` pointer) holds tensor-parallel parts.
template <class Models>
bool any_split_parameters(const Models& models) {
  for (const auto& m : models)
    if (!split_layouts(*m.module).empty()) return true;
  return false;
}

// The whole shape of which a tensor of shape `part` is this rank's part.
std::vector<int64_t> whole_shape(c10::IntArrayRef part, const SplitLayout& layout);

// Collective over the layout's group: every member calls it for the same parameter, in the
// same order. The whole tensor (on the part's device).
torch::Tensor gather_whole(Engine& engine, const torch::Tensor& part, const SplitLayout& layout);

// This rank's part of `whole` (contiguous). Error naming `what` when whole is not of the
// shape whose part is `part_shape`.
torch::Tensor cut_part(const torch::Tensor& whole, c10::IntArrayRef part_shape, const SplitLayout& layout,
                       const std::string& what);

// clip_grad_norm_ over `parameters`, some of which are tensor-parallel parts (`split`, by
// TensorImpl): the norm of the whole gradients, the parts' contribution summed (or, for the
// infinity norm, maxed) over their group; every gradient scaled as LibTorch's clip_grad_norm_
// scales it. Collective over the group. Returns the norm before clipping.
double clip_split_grad_norm(Engine& engine, const std::vector<torch::Tensor>& parameters,
                            const std::map<const void*, SplitLayout>& split, double max_norm, double norm_type);

}  // namespace hasten::detail
