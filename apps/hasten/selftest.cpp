// hasten-selftest: the program `hasten test` launches on every process of the configured run.
// It trains a small two-layer network (both Linear layers declared units, so sharding
// strategies shard them) on a learnable synthetic task with the config the launcher hands it,
// then checks what a broken setup gets wrong:
//   - the loss, averaged over ranks, went down (gradients reach the optimizer);
//   - every rank's model gives bit-identical outputs on one probe batch (parameters agree: the
//     gradients were synchronised and the updates applied alike);
//   - gather and reduce return what each rank contributed.
// Each rank writes its verdict as JSON to <--result DIR>/rank_<r>.json; an error ends the rank
// with exit 1 after writing the error's one line there too.
#include "selftest.hpp"

#include <hasten/hasten.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <sstream>

namespace hasten::selftest {
namespace {

struct NetImpl : torch::nn::Module {
  hasten::Unit<torch::nn::Linear> fc1{nullptr}, fc2{nullptr};
  NetImpl() {
    fc1 = register_module("fc1", hasten::Unit<torch::nn::Linear>(16, 64));
    fc2 = register_module("fc2", hasten::Unit<torch::nn::Linear>(64, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
};
TORCH_MODULE(Net);

std::string show(double v) {
  std::ostringstream o;
  o.precision(4);
  o << v;
  return o.str();
}

}  // namespace

void write_result(const std::string& dir, int rank, const nlohmann::ordered_json& result) {
  if (dir.empty()) return;
  const std::string path = dir + "/rank_" + std::to_string(rank) + ".json";
  std::ofstream out(path);
  out << result.dump() << "\n";
}

nlohmann::ordered_json run(int64_t steps) {
  hasten::Accelerator acc;  // the config `hasten test` resolved, through the launcher
  torch::manual_seed(1234);
  Net model;
  // The task: 4 classes decided by a fixed random linear map of 16 features.
  const int64_t n = 1024;
  auto x = torch::randn({n, 16});
  auto teacher = torch::randn({16, 4});
  auto y = x.matmul(teacher).argmax(1);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  hasten::DataLoader data(hasten::TensorDataset(x, y), {.batch_size = 16, .shuffle = true});
  auto [net, opt, loader] = acc.prepare(model, optimizer, data);

  std::vector<torch::Tensor> losses;
  int64_t step = 0;
  while (step < steps) {
    for (auto& b : loader) {
      auto scope = acc.accumulate(net);
      auto loss = torch::nn::functional::cross_entropy(net(b.input), b.target);
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
      losses.push_back(loss.detach());
      if (++step >= steps) break;
    }
  }
  const int world = acc.num_processes(), rank = acc.process_index();
  nlohmann::ordered_json result = {{"rank", rank},
                                   {"ok", false},
                                   {"processes", world},
                                   {"strategy", acc.strategy()},
                                   {"mixed_precision", acc.mixed_precision()},
                                   {"steps", steps}};

  // 1. The loss went down: mean of the first and of the last five steps, averaged over ranks.
  auto mean_losses = acc.reduce(torch::stack(losses).to(torch::kDouble), "mean");
  const int64_t k = std::min<int64_t>(5, steps / 2);
  const double first = mean_losses.narrow(0, 0, k).mean().item<double>();
  const double last = mean_losses.narrow(0, steps - k, k).mean().item<double>();
  result["first_loss"] = first;
  result["last_loss"] = last;
  if (!std::isfinite(last) || !(last < 0.8 * first))
    throw CheckFailed("the loss did not go down: mean of the first " + std::to_string(k) + " steps " + show(first) +
                      ", of the last " + show(last) + " (expected below 0.8 times the first)");

  // 2. The ranks agree: one probe batch, the same on every rank, through every rank's model.
  torch::Tensor out;
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(99);
    out = net(torch::randn({8, 16}).to(acc.device())).to(torch::kCPU);
  }
  auto outs = acc.gather(out).reshape({world, 8, 4});
  for (int r = 1; r < world; ++r) {
    const double diff = (outs[r] - outs[0]).abs().max().item<double>();
    if (diff != 0)
      throw CheckFailed("rank " + std::to_string(r) + "'s model differs from rank 0's after training (largest output difference " +
                        show(diff) + "): gradients were not synchronised or updates not applied alike");
  }

  // 3. Collectives return what each rank gave: gather in rank order, reduce sums.
  auto gathered = acc.gather(torch::full({2}, static_cast<int64_t>(rank), torch::kLong));
  auto expected = torch::arange(world, torch::kLong).repeat_interleave(2);
  if (!gathered.equal(expected))
    throw CheckFailed("gather returned " + show(gathered.sum().item<double>()) + " in total, expected " +
                      show(expected.sum().item<double>()) + " (each rank's rank, twice, in rank order)");
  const double sum = acc.reduce(torch::tensor({static_cast<double>(rank + 1)}), "sum").item<double>();
  if (sum != world * (world + 1) / 2.0)
    throw CheckFailed("reduce(sum) of rank+1 returned " + show(sum) + ", expected " + show(world * (world + 1) / 2.0));

  acc.wait_for_everyone();
  result["ok"] = true;
  return result;
}

}  // namespace hasten::selftest
