// hasten-test-safetensors: the C++ side of tests/integration/test_safetensors_numpy.py.
//   write FILE   saves a small model's state (its parameters and buffers of every dtype) with
//                hasten::save_safetensors, then prints the tensors it saved
//   read FILE    loads FILE with hasten::load_safetensors and prints the tensors it got
// The printout is one JSON list of {"name", "dtype", "shape", "values"}, values flattened in
// row-major order: floating-point ones as the doubles they widen to exactly (so Python can
// compare them bit for bit), integers as integers, BOOL as true/false.
#include <hasten/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <iostream>
#include <limits>
#include <string>

namespace {

// A model as a program would hold one: two layers, and buffers for the other dtypes, edge
// values included (signed zero, subnormals, the largest finite half, integer extremes).
struct Net : torch::nn::Module {
  Net() {
    torch::manual_seed(7);
    fc1 = register_module("fc1", torch::nn::Linear(3, 4));
    fc2 = register_module("fc2", torch::nn::Linear(4, 2));
    register_buffer("running_var", torch::tensor({-0.0, 1e-310, 1.0 / 3.0, 1e300}, torch::kDouble));
    register_buffer("half", torch::tensor({-0.0f, 65504.0f, 6e-8f, 0.1f, -2.5f}).to(torch::kHalf));
    register_buffer("bf16", torch::randn({2, 3}).to(torch::kBFloat16));
    register_buffer("step", torch::tensor(int64_t{-9'007'199'254'740'993}));  // beyond a double's integers
    register_buffer("counts", torch::tensor({std::numeric_limits<int32_t>::min(), 0, 5, std::numeric_limits<int32_t>::max()},
                                            torch::kInt).reshape({2, 2}));
    register_buffer("codes", torch::tensor({-32768, 32767, 3}, torch::kInt).to(torch::kShort));
    register_buffer("small", torch::tensor({-128, 127, -1}, torch::kInt).to(torch::kChar));
    register_buffer("bytes", torch::arange(0, 256, 37, torch::kInt).to(torch::kByte));
    register_buffer("mask", torch::tensor({1, 0, 1, 1, 0, 0}, torch::kInt).to(torch::kBool).reshape({2, 3}));
    register_buffer("empty", torch::empty({0, 4}));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

const char* dtype_code(torch::ScalarType t) {
  switch (t) {
    case torch::kDouble: return "F64";
    case torch::kFloat: return "F32";
    case torch::kHalf: return "F16";
    case torch::kBFloat16: return "BF16";
    case torch::kLong: return "I64";
    case torch::kInt: return "I32";
    case torch::kShort: return "I16";
    case torch::kChar: return "I8";
    case torch::kByte: return "U8";
    case torch::kBool: return "BOOL";
    default: return "?";
  }
}

nlohmann::json report(const hasten::NamedTensors& tensors) {
  nlohmann::json out = nlohmann::json::array();
  for (auto& [name, tensor] : tensors) {
    const torch::Tensor flat = tensor.detach().cpu().contiguous().flatten();
    nlohmann::json values = nlohmann::json::array();
    if (flat.is_floating_point()) {
      const torch::Tensor d = flat.to(torch::kDouble);  // exact for every float dtype here
      for (int64_t i = 0; i < d.numel(); ++i) values.push_back(d.data_ptr<double>()[i]);
    } else if (flat.scalar_type() == torch::kBool) {
      for (int64_t i = 0; i < flat.numel(); ++i) values.push_back(flat.data_ptr<bool>()[i]);
    } else {
      const torch::Tensor l = flat.to(torch::kLong);
      for (int64_t i = 0; i < l.numel(); ++i) values.push_back(l.data_ptr<int64_t>()[i]);
    }
    out.push_back({{"name", name}, {"dtype", dtype_code(tensor.scalar_type())}, {"shape", tensor.sizes().vec()},
                   {"values", values}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[1]) != "write" && std::string(argv[1]) != "read")) {
    std::cerr << "hasten-test-safetensors: error: usage: hasten-test-safetensors write|read FILE" << std::endl;
    return 2;
  }
  try {
    hasten::NamedTensors state;
    if (std::string(argv[1]) == "write") {
      Net net;
      for (auto& p : net.named_parameters()) state.emplace_back(p.key(), p.value());
      for (auto& b : net.named_buffers()) state.emplace_back(b.key(), b.value());
      hasten::save_safetensors(argv[2], state);
    } else {
      state = hasten::load_safetensors(argv[2]);
    }
    std::cout << report(state).dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "hasten-test-safetensors: error: " << e.what() << std::endl;
    return 1;
  }
}
