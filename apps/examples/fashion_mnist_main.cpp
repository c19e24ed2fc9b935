// hasten-fashion-mnist's command line (fashion_mnist.cpp holds the training).
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "fashion_mnist.hpp"
#include "fashion_mnist_data.hpp"

namespace {

using hasten::examples::fashion::Args;
using hasten::examples::fashion::train;

// CLI11's own range checks print the type's whole range ("not in range 0.000000 to 1.79e308"
// in full); these say what is allowed in words.
CLI::Validator whole_number(int64_t min) {
  return CLI::Validator(
      [min](std::string& s) -> std::string {
        try {
          size_t used = 0;
          if (std::stoll(s, &used) >= min && used == s.size()) return {};
        } catch (const std::exception&) {
        }
        return "expects a whole number >= " + std::to_string(min) + ", got '" + s + "'";
      },
      "INT>=" + std::to_string(min));
}

CLI::Validator positive_real() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          size_t used = 0;
          if (std::stod(s, &used) > 0 && used == s.size()) return {};
        } catch (const std::exception&) {
        }
        return "expects a number > 0, got '" + s + "'";
      },
      "NUMBER>0");
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"hasten-fashion-mnist: train a small CNN on Fashion-MNIST through hasten"};
  app.add_option("--epochs", a.epochs, "Passes over the 60,000 training images")->check(whole_number(1));
  app.add_option("--max_steps,--max-steps", a.max_steps, "Stop after this many optimizer steps in all (0: no limit)")
      ->check(whole_number(0));
  app.add_option("--batch_size,--batch-size", a.batch_size, "Per-process batch size")->check(whole_number(1));
  app.add_option("--eval_batch_size,--eval-batch-size", a.eval_batch_size, "Per-process batch size of the evaluation")
      ->check(whole_number(1));
  app.add_option("--lr", a.lr, "Adam learning rate")->check(positive_real());
  app.add_option("--seed", a.seed, "Seed of the initial weights and the shuffle order");
  app.add_option("--threads", a.threads, "Intra-op threads per process (LibTorch's pool, which sizes MKL's; an OpenBLAS's own pool)")->check(whole_number(1));
  app.add_option("--log_every,--log-every", a.log_every, "Log the training loss to the trackers every N steps (0: off)")
      ->check(whole_number(0));
  app.add_option("--log_samples,--log-samples", a.log_samples,
                 "After each epoch, show the trackers the first N test images (a strip) and a table of the model's guesses (0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{64}));
  app.add_option("--data_dir,--data-dir", a.data_dir, "Directory of the four IDX files (.gz or not)");
  std::string project_dir, config_file, mp, strategy;
  std::vector<std::string> trackers, sets;
  app.add_option("--project_dir,--project-dir", project_dir,
                 "Checkpoints (<dir>/checkpoints) and tracker logs (<dir>/hasten_logs); default: the config's");
  app.add_flag("--resume", a.resume, "Continue from the newest complete checkpoint under <project_dir>, if any");
  app.add_flag("--json", a.json, "Print only a JSON summary line (main process)");
  app.add_flag("--quiet", a.quiet, "No progress bar");
  app.add_option("--config_file,--config-file", config_file, "hasten config file");
  app.add_option("--mixed_precision,--mixed-precision", mp, "no, bf16 or fp16");
  app.add_option("--strategy", strategy, "Strategy plugin (single, ddp, zero1-3, fsdp...)");
  app.add_option("--trackers,--log_with", trackers, "Tracker plugins (e.g. csv jsonl)");
  app.add_option("--set", sets, "Any config key, KEY=VALUE (repeatable)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "hasten-fashion-mnist: error: " << e.what() << " (see --help)" << std::endl;
    return 2;
  }
  hasten::Options options;
  for (const auto& kv : sets) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) {
      std::cerr << "hasten-fashion-mnist: error: --set expects KEY=VALUE, got '" << kv << "'" << std::endl;
      return 2;
    }
    options.set.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  if (!project_dir.empty()) options.project_dir = project_dir;
  if (!config_file.empty()) options.config_file = config_file;
  if (!mp.empty()) options.mixed_precision = mp;
  if (!strategy.empty()) options.strategy = strategy;
  if (!trackers.empty()) options.trackers = trackers;
  try {
    return train(a, options);
  } catch (const hasten::examples::DataSetMissing& e) {
    std::cerr << "hasten-fashion-mnist: error: " << e.what() << std::endl;
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "hasten-fashion-mnist: error: " << e.what() << std::endl;
    return 1;
  }
}
