// The plain LibTorch `model->zero_grad()` under every strategy: Accelerate's test_script.py
// `training_check` in hasten's words. A regression model (y = a x + b) trains on 2 ranks with
// `model->zero_grad()` (not the prepared optimizer's) before each forward, and must end where
// the same model trained in one process on the same global batches ends.
//
// The single-process reference runs inside every worker, in lockstep: it trains on the global
// batch (every rank's batch, gathered in rank order), so it sees exactly the samples the
// distributed step averages over, in the same order, whatever the loader's shuffle.
// The comparison has a tolerance (1e-5): the reference's mean over 16 samples and the ranks'
// means over 8, averaged across ranks, add the same terms in a different order, so the last
// bits may differ; the failure this guards against is far larger (a stale sharded gradient
// left a = 0.36 where the reference reaches 1.94).
#include <hasten/hasten.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>

#include "test_util.hpp"

// A namespace per file: the files of this executable compile as one unit.
namespace zero_grad_tests {

using hasten::Accelerator;

namespace {

using hasten::test::require;

struct RegressionImpl : torch::nn::Module {
  RegressionImpl() {
    a = register_parameter("a", torch::zeros({}));
    b = register_parameter("b", torch::zeros({}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x * a + b; }
  torch::Tensor a, b;
};

// test_utils/training.py's RegressionDataset: y = 2x + 3 + noise.
hasten::TensorDataset regression_data(int64_t length) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  auto x = at::normal(0, 1, {length}, gen);
  auto y = 2 * x + 3 + at::normal(0, 0.1, {length}, gen);
  return hasten::TensorDataset(x, y);
}

hasten::LaunchOptions two_ranks(const std::string& strategy) {
  return hasten::test::with_ranks(2, {{"HASTEN_STRATEGY", strategy}});
}

// `spelling`: how the gradients are cleared before each forward.
//   "module": net->zero_grad() on the module the user built, alternating LibTorch's two
//             modes (in place, and set_to_none) from one step to the next;
//   "prepared": model->zero_grad() through the prepared model.
void training_check(const std::string& strategy, const std::string& spelling) {
  hasten::launch(
      [strategy, spelling] {
        Accelerator acc;
        require(acc.num_processes() == 2, "two ranks");
        const int64_t batch_size = 8, length = batch_size * 4 * 2;
        hasten::DataLoader data(regression_data(length), {.batch_size = batch_size, .shuffle = true, .seed = 42});
        auto net = std::make_shared<RegressionImpl>();
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
        auto [loader, model, opt] = acc.prepare(data, net, sgd);

        RegressionImpl ref;  // the single-process run
        torch::optim::SGD ref_sgd(ref.parameters(), torch::optim::SGDOptions(0.1));
        int step = 0;
        for (int epoch = 0; epoch < 3; ++epoch) {
          for (auto& batch : loader) {
            if (spelling == "prepared")
              model->zero_grad();
            else
              net->zero_grad(/*set_to_none=*/step % 2 == 1);
            auto loss = torch::mse_loss(model(batch.input), batch.target);
            acc.backward(loss);
            opt.step();

            const auto x = acc.gather(batch.input), y = acc.gather(batch.target);
            ref.zero_grad();
            torch::mse_loss(ref.forward(x), y).backward();
            ref_sgd.step();
            ++step;
          }
        }
        require(step == 12, "4 batches an epoch for 3 epochs, got " + std::to_string(step));
        // The full state dict comes to the main process; it tells the others.
        torch::Tensor ab = torch::zeros({2});
        if (acc.is_main_process()) {
          std::map<std::string, torch::Tensor> state;
          for (auto& [name, t] : acc.get_state_dict(model)) state[name] = t;
          require(state.count("a") && state.count("b"), "the state dict names a and b");
          ab = torch::stack({state.at("a"), state.at("b")}).to(torch::kFloat);
        } else {
          acc.get_state_dict(model);  // a collective under sharding: every rank calls it
        }
        ab = acc.broadcast(ab, 0);
        const double a = ab[0].item<double>(), b = ab[1].item<double>();
        const double ra = ref.a.item<double>(), rb = ref.b.item<double>();
        const std::string where = strategy + " (" + spelling + "): a " + std::to_string(a) + " vs " +
                                  std::to_string(ra) + ", b " + std::to_string(b) + " vs " + std::to_string(rb);
        require(std::abs(a - ra) < 1e-5 && std::abs(b - rb) < 1e-5, "not the single-process result: " + where);
        require(ra > 1.5 && rb > 2.5, "the reference did not train: " + where);
      },
      two_ranks(strategy));
}

}  // namespace

TEST(ZeroGrad, ModuleZeroGradMatchesSingleProcessUnderDdp) { training_check("ddp", "module"); }
TEST(ZeroGrad, ModuleZeroGradMatchesSingleProcessUnderZero1) { training_check("zero1", "module"); }
TEST(ZeroGrad, ModuleZeroGradMatchesSingleProcessUnderZero2) { training_check("zero2", "module"); }
TEST(ZeroGrad, ModuleZeroGradMatchesSingleProcessUnderZero3) { training_check("zero3", "module"); }
TEST(ZeroGrad, ModuleZeroGradMatchesSingleProcessUnderFsdp) { training_check("fsdp", "module"); }
TEST(ZeroGrad, PreparedModelZeroGradMatchesSingleProcessUnderZero2) { training_check("zero2", "prepared"); }
TEST(ZeroGrad, PreparedModelZeroGradMatchesSingleProcessUnderZero3) { training_check("zero3", "prepared"); }

}  // namespace zero_grad_tests
