// A prepared model called past its wrapper: `model->forward(x)` reaches the user's module
// directly, so under bf16/fp16 it runs without autocast (silently in float32) and under a
// sharding strategy without the unit events. The prepared call records its outputs' autograd
// nodes; a backward that reaches a model's parameters through none of them is refused.
#include <hasten/error.hpp>

#include <unordered_map>

#include "engine/autograd_graph.hpp"
#include "engine/engine_state.hpp"

namespace hasten::detail {

namespace {
// Enough for every call of one step (several micro-batches of a GAN, say); older entries
// belong to graphs a backward already consumed.
constexpr size_t kMaxOutputNodes = 64;
}  // namespace

void Engine::model_forward_outputs(size_t model, const std::vector<torch::Tensor>& outputs) {
  ModelEntry& m = impl_->models.at(model);
  m.forwarded = true;
  if (outputs.empty()) m.outputs_untracked = true;  // a struct of outputs: nothing to check
  for (const auto& t : outputs)
    if (t.defined() && t.grad_fn()) m.output_nodes.emplace_back(t.grad_fn());
  if (m.output_nodes.size() > kMaxOutputNodes) {
    std::vector<compat::WeakNodePtr> live;
    for (auto& w : m.output_nodes)
      if (!w.expired()) live.push_back(std::move(w));
    if (live.size() > kMaxOutputNodes) live.erase(live.begin(), live.end() - kMaxOutputNodes);
    m.output_nodes = std::move(live);
  }
}

void Engine::Impl::check_prepared_forwards(const torch::Tensor& loss) {
  // Fast path: every model was called through its wrapper since the last backward.
  bool all = true;
  for (auto& m : models) all = all && (m.forwarded || m.outputs_untracked);
  for (auto& m : models) m.forwarded = false;
  if (all || !loss.grad_fn()) return;

  // Which model each recorded output node belongs to.
  std::unordered_map<const torch::autograd::Node*, size_t> recorded;
  for (size_t i = 0; i < models.size(); ++i)
    for (auto& w : models[i].output_nodes)
      if (auto node = w.lock()) recorded.emplace(node.get(), i);

  // Walk the graph: the models whose outputs it contains, and the leaf tensors it reaches.
  std::vector<bool> called(models.size(), false);
  const auto leaves = graph_leaves(loss.grad_fn().get(), [&](const torch::autograd::Node* node) {
    if (auto it = recorded.find(node); it != recorded.end()) called[it->second] = true;
  });
  for (size_t i = 0; i < models.size(); ++i) {
    if (called[i] || models[i].outputs_untracked) continue;
    for (const auto& p : models[i].module->parameters()) {
      if (!leaves.count(p.unsafeGetTensorImpl())) continue;
      throw UsageError("backward: the loss reaches the parameters of prepared model " + std::to_string(i) + " (" +
                       models[i].module->name() +
                       ") without a call of the prepared model: `model->forward(x)` or a call of the module "
                       "given to prepare skips hasten's autocast (" + precision->name() + ") and strategy ('" +
                       strategy->name() + "'); call the prepared model: `model(x)`");
    }
  }
}

}  // namespace hasten::detail
