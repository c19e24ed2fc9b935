// hasten-bench --max-model-trial: one trial of the --max-model search (max_model.cpp), run in a
// child process: the size-s model trained a few steps under ddp2 or zero3 on 2 processes. Apart
// from the search, which needs no LibTorch: only this file trains.
#include "max_model.hpp"

#include <hasten/hasten.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "workloads.hpp"

namespace hasten::bench {

void max_model_trial(const std::string& mode, int size, int seq, int batch) {
  if (mode != "ddp2" && mode != "zero3") throw hasten::Error("--max-model-trial: mode must be ddp2 or zero3");
  hasten::LaunchOptions lo;
  lo.num_processes = kMaxModelProcesses;
  lo.timeout_s = 7200;
  hasten::launch(
      [&] {
        namespace W = hasten::workloads;
        hasten::Options o;
        o.strategy = mode == "ddp2" ? "ddp" : "zero3";
        hasten::Accelerator acc(o);
        torch::manual_seed(0);
        const GptShape s = gpt_shape(size);
        auto model = std::make_shared<W::TinyGptImpl>(kMaxModelVocab, seq, s.d_model, s.nhead, s.ff, s.layers, mode == "zero3");
        int64_t params = 0;
        for (auto& p : model->parameters()) params += p.numel();
        torch::optim::AdamW optimizer(model->parameters(), W::optimizer_options());
        auto [net, opt] = acc.prepare(model, optimizer);
        torch::manual_seed(1 + acc.process_index());
        for (int step = 0; step < kMaxModelSteps; ++step) {
          const torch::Tensor tokens = torch::randint(0, kMaxModelVocab, {seq + 1, batch}, torch::kLong);
          const torch::Tensor logits = net(tokens.narrow(0, 0, seq));
          acc.backward(W::loss("gpt-tiny", logits, tokens.narrow(0, 1, seq).t()));
          opt.step();
          opt.zero_grad();
        }
        auto rss = acc.gather(torch::tensor({W::peak_rss_mb()}, torch::kDouble)).to(torch::kCPU);
        if (acc.is_main_process())
          std::cout << nlohmann::ordered_json{{"impl", "hasten"}, {"mode", mode}, {"size", size}, {"params", params},
                                              {"peak_rss_mb", std::vector<double>(rss.data_ptr<double>(),
                                                                                  rss.data_ptr<double>() + rss.numel())}}
                           .dump()
                    << std::endl;
      },
      lo);
}

}  // namespace hasten::bench
