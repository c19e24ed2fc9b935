// Helpers shared by the unit tests that look at tensors' values (LibTorch; test_util.hpp has
// the rest and stays free of it).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hasten::test {

// Batches of indices, as a test expects a loader to deal them.
using Lists = std::vector<std::vector<int64_t>>;

// A tensor's elements, flattened, as int64 (for comparing indices and small integer values).
inline std::vector<int64_t> to_vector(const torch::Tensor& t) {
  auto c = t.to(torch::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// "[1, 2, 3]", for failure messages.
inline std::string str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// "[[0,1][2,3]]", for failure messages.
inline std::string str(const Lists& l) {
  std::string s = "[";
  for (auto& b : l) {
    s += "[";
    for (size_t i = 0; i < b.size(); ++i) s += (i ? "," : "") + std::to_string(b[i]);
    s += "]";
  }
  return s + "]";
}

}  // namespace hasten::test
