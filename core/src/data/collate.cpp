// Collation: examples stacked into batches, samples of named tensors stacked by name or handed
// to the user's collate function, and the checks that keep every batch one row per sample.
#include <hasten/data.hpp>
#include <hasten/error.hpp>

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace hasten {

namespace detail {

namespace {

torch::data::Example<> stack_examples(std::vector<torch::data::Example<>> examples) {
  std::vector<torch::Tensor> data, target;
  data.reserve(examples.size());
  target.reserve(examples.size());
  for (auto& e : examples) {
    data.push_back(std::move(e.data));
    if (e.target.defined()) target.push_back(std::move(e.target));
  }
  torch::data::Example<> out;
  out.data = torch::stack(data);
  if (!target.empty()) {
    if (target.size() != data.size())
      throw Error("DataLoader: some examples have a target and some do not");
    out.target = torch::stack(target);
  }
  return out;
}

}  // namespace

Batch collate(std::vector<torch::data::Example<>> examples, const std::vector<int64_t>& indices) {
  auto stacked = stack_examples(std::move(examples));
  Batch b;
  b.input = std::move(stacked.data);
  b.target = std::move(stacked.target);
  b.indices = torch::tensor(indices, torch::kLong);
  return b;
}

TensorDict as_sample(torch::data::Example<> example) {
  TensorDict s{{"input", std::move(example.data)}};
  if (example.target.defined()) s.emplace("target", std::move(example.target));
  return s;
}

Batch collate_samples(std::vector<TensorDict> samples, const std::vector<int64_t>& indices,
                      const std::function<Batch(std::vector<TensorDict>)>& collate) {
  const int64_t n = static_cast<int64_t>(samples.size());
  Batch b;
  if (collate) {
    b = collate(std::move(samples));
  } else {
    // Every sample names the same tensors; each name is stacked.
    for (size_t k = 1; k < samples.size(); ++k) {
      bool same = samples[k].size() == samples[0].size();
      for (auto a = samples[k].begin(), z = samples[0].begin(); same && a != samples[k].end(); ++a, ++z)
        same = a->first == z->first;
      if (!same)
        throw Error("DataLoader: sample " + std::to_string(indices[k]) + " names other tensors than sample " +
                    std::to_string(indices[0]) + " of the same batch (give a collate function to batch them)");
    }
    if (!samples.empty())
      for (auto& [name, first] : samples[0]) {
        std::vector<torch::Tensor> parts;
        parts.reserve(samples.size());
        for (auto& s : samples) parts.push_back(s.at(name));
        try {
          b.fields[name] = torch::stack(parts);
        } catch (const c10::Error&) {
          throw Error("DataLoader: field '" + name + "' of the samples " + std::to_string(indices.front()) + ".." +
                      std::to_string(indices.back()) + " has different shapes and cannot be stacked (give a collate "
                      "function, e.g. one that pads them)");
        }
      }
  }
  // Padding, gather_for_metrics and dispatch slice batches along dim 0.
  const auto check = [&](const std::string& what, const torch::Tensor& t) {
    if (t.defined() && (t.dim() == 0 || t.size(0) != n))
      throw Error("DataLoader: the collate function's " + what + " does not hold the batch's " + std::to_string(n) +
                  " samples along dim 0" + (t.dim() == 0 ? " (a scalar)" : " (it has " + std::to_string(t.size(0)) + ")"));
  };
  check("input", b.input);
  check("target", b.target);
  for (const auto& [name, t] : b.fields) check("field '" + name + "'", t);
  b.indices = torch::tensor(indices, torch::kLong);
  b.num_padding = 0;
  return b;
}

ExampleBatch collate_examples(std::vector<torch::data::Example<>> examples,
                              const std::vector<int64_t>& indices) {
  if (examples.size() != indices.size())
    throw Error("DataLoader: the dataset's get_batch returned " + std::to_string(examples.size()) +
                " examples for " + std::to_string(indices.size()) + " indices");
  return example_batch(stack_examples(std::move(examples)), indices);
}

ExampleBatch example_batch(torch::data::Example<> stacked, const std::vector<int64_t>& indices) {
  // A transform that changed the number of samples would break padding and gather_for_metrics.
  const int64_t n = static_cast<int64_t>(indices.size());
  if (!stacked.data.defined() || stacked.data.dim() == 0 || stacked.data.size(0) != n)
    throw Error("DataLoader: the dataset's batch for " + std::to_string(n) +
                " indices does not have " + std::to_string(n) + " samples along dim 0");
  ExampleBatch b;
  b.data = std::move(stacked.data);
  b.target = std::move(stacked.target);
  b.indices = torch::tensor(indices, torch::kLong);
  return b;
}

}  // namespace detail
}  // namespace hasten
