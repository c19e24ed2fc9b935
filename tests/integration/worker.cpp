// hasten-test-worker: a small data-parallel training program whose ranks misbehave on
// request, for the launcher and failure tests (tests/integration/test_launcher.py).
//   --steps N                    train N steps (one gradient allreduce each)
//   --fail-rank R --fail-step S --exit-code C   rank R exits with C at step S
//   --hang-rank R --hang-step S  rank R sleeps forever at step S (its peers wait in a collective)
//   --late-rank R --late-s T     rank R sleeps T seconds before joining the rendezvous
//   --short-rank R               rank R trains half the steps, then reduces a 3-element tensor
//                                while the others are still in gradient allreduces (ranks
//                                entering different collectives)
//   --load DIR                   load_state(DIR) after prepare
//   --save DIR                   save_state(DIR) after the steps
//   --tag X                      ignored: marks the command line so tests can find leftovers
// Prints "params <fingerprint>" at the end: a weighted sum of every parameter (%.17g).
#include <hasten/hasten.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  int steps = 10, fail_rank = -1, fail_step = -1, exit_code = 3, hang_rank = -1, hang_step = -1, late_rank = -1, short_rank = -1;
  double late_s = 0;
  std::string load_dir, save_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--steps") steps = std::stoi(v);
    else if (k == "--fail-rank") fail_rank = std::stoi(v);
    else if (k == "--fail-step") fail_step = std::stoi(v);
    else if (k == "--exit-code") exit_code = std::stoi(v);
    else if (k == "--hang-rank") hang_rank = std::stoi(v);
    else if (k == "--hang-step") hang_step = std::stoi(v);
    else if (k == "--late-rank") late_rank = std::stoi(v);
    else if (k == "--late-s") late_s = std::stod(v);
    else if (k == "--short-rank") short_rank = std::stoi(v);
    else if (k == "--load") load_dir = v;
    else if (k == "--save") save_dir = v;
    else if (k == "--tag") {
    } else {
      std::cerr << "hasten-test-worker: error: unknown flag " << k << std::endl;
      return 2;
    }
  }
  const int rank = std::getenv("RANK") ? std::atoi(std::getenv("RANK")) : 0;
  try {
    if (rank == late_rank) std::this_thread::sleep_for(std::chrono::duration<double>(late_s));
    hasten::Accelerator acc;
    torch::manual_seed(0);
    auto model = std::make_shared<torch::nn::LinearImpl>(16, 4);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    auto [net, opt] = acc.prepare(model, sgd);
    if (!load_dir.empty()) acc.load_state(load_dir);
    for (int step = 0; step < (rank == short_rank ? steps / 2 : steps); ++step) {
      if (rank == fail_rank && step == fail_step) {
        std::cout << "rank " << rank << " exits with " << exit_code << " at step " << step << std::endl;
        return exit_code;
      }
      if (rank == hang_rank && step == hang_step) {
        std::cout << "rank " << rank << " hangs at step " << step << std::endl;
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      auto x = torch::randn({8, 16});
      acc.backward(net(x).pow(2).mean());
      opt.step();
      opt.zero_grad();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (rank == short_rank) {
      std::cout << "rank " << rank << " stopped early at step " << steps / 2 << std::endl;
      acc.reduce(torch::ones({3}), "sum");
    }
    if (!save_dir.empty()) acc.save_state(save_dir);
    double fingerprint = 0;
    double weight = 1;
    for (auto& p : model->parameters()) {
      auto flat = p.detach().to(torch::kDouble).flatten();
      for (int64_t i = 0; i < flat.numel(); ++i) fingerprint += (weight += 1) * flat[i].item<double>();
    }
    char line[64];
    std::snprintf(line, sizeof line, "%.17g", fingerprint);
    acc.print("params ", line);
    acc.print("done ", steps, " steps");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "hasten-test-worker: error: rank " << rank << ": " << e.what() << std::endl;
    return 1;
  }
}
