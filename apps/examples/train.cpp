// hasten-example: trains a workload of docs/workloads.md through hasten (the default) or
// through a plain LibTorch loop (--impl libtorch), shows progress on stderr on the local main
// process (hasten::ProgressBar; --quiet: none), logs to the configured trackers, and with
// --json prints the same summary fields as the PyTorch peer
// (tests/integration/peers/torch_peer.py) so runs compare directly.
//
//   hasten-example --workload mlp-small --steps 200
//   hasten launch --num_processes 2 build/bin/hasten-example --workload gpt-tiny --json
//   hasten-example --log_with tensorboard,mlflow,csv,jsonl --project_dir runs
#include <CLI/CLI.hpp>

#include <iostream>

#include "../cli_checks.hpp"
#include "../error_line.hpp"
#include "runner.hpp"
#include "workloads.hpp"

namespace W = hasten::workloads;
using Args = hasten::examples::Args;
using hasten::examples::run;

// Steps and batch beyond these are typos: the run keeps a loss per step (--steps 99999999999
// would first fail allocating them) and a batch of its samples.
constexpr long long kMaxSteps = 100'000'000;
constexpr long long kMaxBatch = 1 << 20;

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"hasten-example: train a benchmark workload through hasten"};
  app.add_option("--workload", a.workload, "mlp-small, mlp-large or gpt-tiny")
      ->check(CLI::IsMember(W::names()));
  app.add_option("--steps", a.steps, "Timed steps after the warmup (default: the workload's S)")
      ->check(hasten::cli::integer_in(0, kMaxSteps));
  app.add_option("--warmup", a.warmup, "Untimed steps first")->check(hasten::cli::integer_in(0, kMaxSteps));
  app.add_option("--batch", a.batch, "Per-process batch size (default: the workload's B)")
      ->check(hasten::cli::integer_in(1, kMaxBatch));
  app.add_option("--impl", a.impl, "hasten, or libtorch for the plain loop")
      ->check(CLI::IsMember({"hasten", "libtorch"}));
  app.add_option("--mode", a.mode, "Label of the run in the JSON summary");
  app.add_flag("--json", a.json, "Print the summary as one JSON line (main process)");
  app.add_option("--losses-out,--losses_out", a.losses_out, "Write every step's loss (JSON) here");
  app.add_option("--log-every,--log_every", a.log_every, "Tracker logging period in steps (0: off)")
      ->check(hasten::cli::integer_in(0, kMaxSteps));
  app.add_flag("--quiet,-q", a.quiet, "No progress bar (it goes to stderr: redrawn on a terminal, else plain lines)");
  app.add_option("--threads", a.threads, "Intra-op threads (LibTorch's pool, which sizes MKL's; an OpenBLAS's own pool)")->check(CLI::PositiveNumber);
  app.add_option("--project", a.project, "Tracker project name");
  app.add_flag("--units", a.units, "Declare every Linear (MLP) or encoder layer (gpt-tiny) a sharding unit");
  app.add_option("--clip", a.clip, "clip_grad_norm_ to this norm on synchronising steps (0: off)")
      ->check(hasten::cli::finite_in(0, 1e30));
  app.add_option("--params-out,--params_out", a.params_out, "Write the final parameters here (safetensors)");
  app.add_option("--trace-out,--trace_out", a.trace_out,
                 "Write rank 0's gradients after every backward and parameters after every optimizer "
                 "call to PREFIX.grads.f32 and PREFIX.params.f32, raw float32 (zero, fsdp: parameters only)");
  std::string project_dir;
  app.add_option("--project_dir,--project-dir", project_dir, "Where checkpoints (and tracker logs) go");
  app.add_option("--checkpoint_every,--checkpoint-every", a.checkpoint_every,
                 "save_state every N steps into <project_dir>/checkpoints")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--resume", a.resume, "Continue from the newest complete checkpoint under <project_dir> (if any)");
  std::string config_file, mp, strategy;
  int accum = 0;
  std::vector<std::string> trackers;
  app.add_option("--config_file,--config-file", config_file, "hasten config file");
  app.add_option("--mixed_precision,--mixed-precision", mp, "no, bf16 or fp16");
  app.add_option("--gradient_accumulation_steps,--gradient-accumulation-steps", accum, "Micro-batches per step")
      ->check(hasten::cli::integer_in(1, 1 << 20));
  app.add_option("--strategy", strategy, "Strategy plugin");
  app.add_option("--trackers", trackers, "Tracker plugins (e.g. csv jsonl)");
  std::vector<std::string> log_with;
  app.add_option("--log_with,--log-with", log_with, "Trackers, Accelerate's way: tensorboard,mlflow,csv,jsonl or all")
      ->delimiter(',');
  std::vector<std::string> sets;
  app.add_option("--set", sets, "Any config key, KEY=VALUE (repeatable)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "hasten-example: error: " << e.what() << std::endl;
    return 2;
  }
  for (const auto& kv : sets) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) {
      std::cerr << "hasten-example: error: --set expects KEY=VALUE, got '" << kv << "'" << std::endl;
      return 2;
    }
    a.options.set.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  if (!project_dir.empty()) a.options.project_dir = project_dir;
  if (!config_file.empty()) a.options.config_file = config_file;
  if (!mp.empty()) a.options.mixed_precision = mp;
  if (accum > 0) a.options.gradient_accumulation_steps = accum;
  if (!strategy.empty()) a.options.strategy = strategy;
  if (!trackers.empty()) a.options.trackers = trackers;
  // Through the config key log_with, so that --log_with and --trackers naming different
  // trackers is the config's error, as in a file.
  if (!log_with.empty()) {
    std::string list;
    for (const auto& t : log_with) list += (list.empty() ? "" : ",") + t;
    a.options.set.emplace_back("log_with", "[" + list + "]");
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "hasten-example: error: " << hasten::cli::error_line(e) << std::endl;
    return 1;
  }
}
