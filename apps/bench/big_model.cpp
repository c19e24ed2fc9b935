#include "big_model.hpp"

#include <hasten/hasten.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>

#include "workloads.hpp"

namespace hasten::bench {

namespace {

constexpr int64_t kBigVocab = 256, kBigSeq = 64, kBigWidth = 1024, kBigHeads = 16, kBigFf = 4096, kBigLayers = 8;
constexpr int64_t kBigBatches = 4, kBigBatch = 4;

std::shared_ptr<workloads::TinyGptImpl> build_big() {
  torch::manual_seed(0);
  return std::make_shared<workloads::TinyGptImpl>(kBigVocab, kBigSeq, kBigWidth, kBigHeads, kBigFf, kBigLayers, /*units=*/true);
}

}  // namespace

void big_model_save(const std::string& dir) {
  std::filesystem::create_directories(dir);
  auto net = build_big();
  NamedTensors tensors;
  uint64_t bytes = 0;
  int64_t params = 0;
  for (auto& p : net->named_parameters()) {
    tensors.emplace_back(p.key(), p.value().detach());
    bytes += static_cast<uint64_t>(p.value().numel()) * p.value().element_size();
    params += p.value().numel();
  }
  save_safetensors((std::filesystem::path(dir) / "model.safetensors").string(), tensors);
  std::cout << nlohmann::json{{"params", params}, {"bytes", bytes}}.dump() << std::endl;
}

void big_model_run(const std::string& side, const std::string& dir, double budget_mib) {
  if (side != "whole" && side != "offload")
    throw UsageError("--big-model-run: '" + side + "' is not a side (allowed: whole, offload)");
  const double before = workloads::rss_mb();
  std::shared_ptr<workloads::TinyGptImpl> net;
  {
    EmptyWeights empty;  // each unit holds nothing once built
    net = build_big();
  }
  const DeviceMap map = side == "whole" ? DeviceMap{{"", "cpu"}}
                                        : infer_auto_device_map(*net, {{"cpu", static_cast<uint64_t>(budget_mib * 1048576.0)}});
  const double built = workloads::peak_rss_mb();
  int disk = 0;
  for (auto& e : map) disk += e.device == "disk";
  load_checkpoint_and_dispatch(*net, dir, map);
  const double dispatched = workloads::peak_rss_mb();
  torch::NoGradGuard no_grad;
  torch::manual_seed(1);
  const torch::Tensor tokens = torch::randint(0, kBigVocab, {kBigBatches, kBigSeq, kBigBatch}, torch::kLong);
  NamedTensors logits;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t b = 0; b < kBigBatches; ++b) logits.emplace_back(std::to_string(b), net->forward(tokens[b]));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << nlohmann::json{{"side", side},
                              {"disk_units", disk},
                              {"units", kBigLayers},
                              {"peak_rss_mb", workloads::peak_rss_mb()},
                              {"rss_before_model_mb", before},
                              {"peak_rss_built_mb", built},
                              {"peak_rss_dispatched_mb", dispatched},
                              {"forward_seconds", seconds},
                              {"logits_checksum", param_checksum(logits)}}
                   .dump()
            << std::endl;
}

}  // namespace hasten::bench
