// Walking the graph a backward of a loss would run: each node once, and the leaf tensors (the
// parameters) it accumulates gradients into. Which prepared models a backward reaches is asked
// twice: by a sharded join (join.cpp: the models a rank out of batches must shadow) and by the
// check for a model called past its wrapper (bypassed_forward.cpp).
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <unordered_set>
#include <vector>

namespace hasten::detail {

// Calls visit(node) once for every node reachable from `root` and returns the TensorImpls of
// the leaf variables the graph accumulates into (compare with `p.unsafeGetTensorImpl()`).
template <class Visit>
std::unordered_set<const void*> graph_leaves(torch::autograd::Node* root, Visit&& visit) {
  std::unordered_set<const void*> leaves;
  if (root == nullptr) return leaves;
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack{root};
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    visit(static_cast<const torch::autograd::Node*>(node));
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) leaves.insert(acc->variable.unsafeGetTensorImpl());
    for (const auto& edge : node->next_edges())
      if (edge.function) stack.push_back(edge.function.get());
  }
  return leaves;
}

inline std::unordered_set<const void*> graph_leaves(torch::autograd::Node* root) {
  return graph_leaves(root, [](const torch::autograd::Node*) {});
}

}  // namespace hasten::detail
