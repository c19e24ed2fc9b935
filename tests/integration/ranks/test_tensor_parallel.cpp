// Tensor parallelism (hasten/tensor_parallel.hpp) against one process, in forked ranks: the char
// LM's model (TinyGpt) split over tp = 2 by its plan (apps/examples/tp_gpt.hpp), prepared under
// ddp, trains 50 AdamW steps to the losses the one-process model has on the same batches, within
// 1e-5, alone (tp 2) and with data parallelism (dp 2 x tp 2 on 4 processes); its split layers
// hold 1/tp of the parameters; a prepared loader gives both ranks of a tp group the same
// samples and gather_for_metrics gathers over dp; zero/fsdp, clip_grad_norm_, save_state,
// join_uneven_inputs and dispatch_batches refuse a tensor-parallel mesh in one line; a group
// outliving its Accelerator says so.
#include <hasten/hasten.hpp>
#include <hasten/tensor_parallel.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "mesh_checks.hpp"
#include "test_util.hpp"
#include "tp_gpt.hpp"

using hasten::Accelerator;
using hasten::test::mesh_options;
using hasten::test::require;
using hasten::test::with_ranks;
using hasten::workloads::TinyGptImpl;
using hasten::workloads::TpGpt;

namespace {

constexpr int64_t kVocab = 96, kSeq = 32, kWidth = 64, kHeads = 4, kFf = 256, kLayers = 2, kBatch = 4, kSteps = 50;

std::shared_ptr<TinyGptImpl> build() {
  torch::manual_seed(0);
  return std::make_shared<TinyGptImpl>(kVocab, kSeq, kWidth, kHeads, kFf, kLayers, false);
}

// Step `step`'s global batch: `rows` sequences of kSeq + 1 tokens.
torch::Tensor tokens(int64_t step, int64_t rows) {
  torch::manual_seed(1000 + step);
  return torch::randint(0, kVocab, {rows, kSeq + 1}, torch::kLong);
}

// The one-process model's losses on the global batches of `rows` sequences.
std::vector<double> reference_losses(int64_t rows) {
  auto net = build();
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
  std::vector<double> losses;
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto t = tokens(step, rows);
    auto loss = hasten::workloads::loss("gpt-tiny", net->forward(t.narrow(1, 0, kSeq).t()), t.narrow(1, 1, kSeq));
    adamw.zero_grad();
    loss.backward();
    adamw.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// Trains TinyGpt split over the mesh's tp group, each dp rank on its part of the global batch,
// and checks every step's loss (averaged over dp) against the one-process model's.
void train_split(int dp, int tp) {
  Accelerator acc(mesh_options(dp, 1, tp));
  auto mesh = acc.device_mesh();
  const auto tp_group = mesh.group("tp"), dp_group = mesh.group("dp");
  require(tp_group.size() == tp && dp_group.size() == dp, "mesh sizes");
  const auto want = reference_losses(kBatch * dp);

  auto whole = build();
  TpGpt split(*whole, tp_group);
  // The split layers hold 1/tp of the whole ones' parameters.
  int64_t whole_split = 0, mine = 0;
  for (const auto& p : whole->named_parameters()) {
    const auto& n = p.key();
    if (n.find("norm") == std::string::npos && n != "pos.weight" && n.find("out_proj.bias") == std::string::npos &&
        n.find("linear2.bias") == std::string::npos)
      whole_split += p.value().numel();
  }
  for (const auto& p : split->named_parameters()) {
    const auto& n = p.key();
    if (n.find("norm") == std::string::npos && n != "pos.weight" && n.find("out_proj.bias") == std::string::npos &&
        n.find("linear2.bias") == std::string::npos)
      mine += p.value().numel();
  }
  require(mine * tp == whole_split, "the split layers hold " + std::to_string(mine) + " parameters, not 1/" +
                                        std::to_string(tp) + " of " + std::to_string(whole_split));
  whole.reset();

  torch::optim::AdamW adamw(split->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, opt] = acc.prepare(split.ptr(), adamw);
  double worst = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto t = tokens(step, kBatch * dp).narrow(0, dp_group.rank() * kBatch, kBatch);
    auto logits = model(t.narrow(1, 0, kSeq).t());
    auto loss = split->loss(logits, t.narrow(1, 1, kSeq));
    acc.backward(loss);
    opt.step();
    opt.zero_grad();
    auto mean = loss.detach().reshape({1}).clone();
    dp_group.all_reduce_(mean, hasten::ReduceOp::Avg);
    const double got = mean.item<double>(), ref = want[static_cast<size_t>(step)];
    worst = std::max(worst, std::abs(got - ref) / std::abs(ref));
    require(std::abs(got - ref) <= 1e-5 * std::abs(ref), "step " + std::to_string(step) + ": loss " + std::to_string(got) +
                                                             ", one process " + std::to_string(ref));
  }
  if (acc.is_main_process())
    std::printf("tp %d x dp %d: %lld steps within %.3g relative of one process (last loss %.6f)\n", tp, dp,
                static_cast<long long>(kSteps), worst, want.back());
  // Both ranks of a tp group hold the same replicated parameters (pos, norms) after training.
  auto pos = split->pos->weight.detach().clone();
  auto first = pos.clone();
  tp_group.broadcast_(first, 0);
  require(torch::equal(pos, first), "the replicated position embedding differs across the tp group");
}

}  // namespace

TEST(TensorParallel, TwoRanksEqualOneProcess) {
  hasten::launch([] { train_split(1, 2); }, with_ranks(2, {{"HASTEN_COMM", "shm"}, {"HASTEN_STRATEGY", "ddp"}}, 300));
}

TEST(TensorParallel, DataParallelTimesTensorParallelEqualOneProcess) {
  hasten::launch([] { train_split(2, 2); }, with_ranks(4, {{"HASTEN_COMM", "gloo"}, {"HASTEN_STRATEGY", "ddp"}}, 300));
}

TEST(TensorParallel, LoaderShardsOverDataParallelRanks) {
  hasten::launch(
      [] {
        Accelerator acc(mesh_options(2, 1, 2));
        hasten::DataLoader data(hasten::TensorDataset(torch::arange(16).reshape({16, 1}), torch::arange(16)),
                                {.batch_size = 2});
        auto loader = acc.prepare(data);
        std::vector<int64_t> mine;
        std::vector<torch::Tensor> metrics;
        for (auto& b : loader) {
          for (int64_t i = 0; i < b.target.size(0); ++i) mine.push_back(b.target[i].item<int64_t>());
          metrics.push_back(acc.gather_for_metrics(b.target));  // over dp: each sample once
        }
        const auto every = torch::cat(metrics);
        require(every.numel() == 16 && std::get<0>(every.sort()).equal(torch::arange(16)),
                "gather_for_metrics under tp does not give each sample once");
        auto t = torch::tensor(mine);
        auto mesh = acc.device_mesh();
        auto partner = t.clone();
        mesh.group("tp").broadcast_(partner, 0);
        require(torch::equal(t, partner), "the two ranks of a tp group read different samples");
        auto all = mesh.group("dp").all_gather(t);
        require(all.numel() == 16 && std::get<0>(all.sort()).equal(torch::arange(16)),
                "the dp ranks together do not read each sample once");
      },
      with_ranks(4, {{"HASTEN_COMM", "shm"}}));
}

TEST(TensorParallel, RefusalsAreOneLine) {
  hasten::launch(
      [] {
        try {
          hasten::Options o = mesh_options(1, 1, 2);
          o.strategy = "zero3";
          Accelerator acc(o);
          require(false, "zero3 accepted a tensor-parallel mesh");
        } catch (const hasten::Error& e) {
          require(std::string(e.what()).find("sharding a tensor-parallel mesh (tp 2) is not supported yet") !=
                      std::string::npos,
                  e.what());
        }
        hasten::Options o = mesh_options(1, 1, 2);
        o.strategy = "ddp";
        Accelerator acc(o);
        auto net = torch::nn::Linear(2, 2);
        torch::optim::SGD sgd(net->parameters(), 0.1);
        auto [model, opt] = acc.prepare(net, sgd);
        acc.backward(model(torch::ones({1, 2})).sum());
        try {
          acc.clip_grad_norm_(model, 1.0);
          require(false, "clip_grad_norm_ under tp was accepted");
        } catch (const hasten::UsageError& e) {
          require(std::string(e.what()).find("tensor-parallel shards is not computed yet") != std::string::npos, e.what());
        }
        try {
          auto scope = acc.join_uneven_inputs({model});
          require(false, "join_uneven_inputs under tp was accepted");
        } catch (const hasten::UsageError& e) {
          require(std::string(e.what()).find("joining uneven inputs under tensor parallelism") != std::string::npos,
                  e.what());
        }
        try {
          hasten::DataLoader data(hasten::TensorDataset(torch::zeros({8, 1}), torch::zeros({8})),
                                  {.batch_size = 2, .dispatch_batches = true});
          auto loader = acc.prepare(data);
          require(false, "dispatch_batches under tp was accepted");
        } catch (const hasten::UsageError& e) {
          require(std::string(e.what()).find("dispatch_batches under tensor parallelism") != std::string::npos, e.what());
        }
        hasten::test::TempDir dir;
        try {
          acc.save_state((dir.path() / "ckpt").string());
          require(false, "save_state under tp was accepted");
        } catch (const hasten::UsageError& e) {
          require(std::string(e.what()).find("checkpoints of tensor-parallel shards are not written") != std::string::npos,
                  e.what());
        }
      },
      with_ranks(2, {{"HASTEN_COMM", "shm"}}));
}

// A strategy built before process groups (ABI 1.10) cannot keep tensor-parallel shards apart
// from replicas: prepare refuses it under tp, and accepts it without.
TEST(TensorParallel, PreGroupsStrategyIsRefusedUnderTp) {
  const std::string plugin = hasten::test::test_plugin("pre_groups", "libhasten-strategy-pre_groups.so");
  hasten::launch(
      [plugin] {
        for (int tp : {2, 1}) {
          hasten::Options o = mesh_options(1, 1, tp);
          if (tp == 1) o.parallelism_config.reset();
          o.strategy = plugin;
          Accelerator acc(o);
          auto net = torch::nn::Linear(2, 2);
          try {
            auto model = acc.prepare(net);
            require(tp == 1, "a 1.10 strategy was accepted under tp 2");
          } catch (const hasten::UsageError& e) {
            require(tp == 2 && std::string(e.what()).find("built against plugin ABI 1.10, before process groups") !=
                                   std::string::npos,
                    e.what());
          }
        }
      },
      with_ranks(2, {{"HASTEN_COMM", "shm"}}));
}
