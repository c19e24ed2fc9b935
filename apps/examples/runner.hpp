// The training run shared by hasten-example and hasten-bench.
#pragma once

#include <hasten/config.hpp>

#include <cstdint>
#include <string>

namespace hasten::examples {

struct Args {
  std::string workload = "mlp-small";
  int64_t steps = -1;  // timed steps; -1: the workload's default
  int64_t warmup = 10;
  int64_t batch = 0;   // 0: the workload's B
  std::string impl = "hasten";
  std::string mode;    // label; default derived from the run
  bool json = false;
  std::string losses_out;
  int64_t log_every = 10;   // tracker logging period (0: no tracker logging)
  bool quiet = false;       // no progress bar (it goes to stderr, on the local main process)
  int threads = 1;
  std::string project = "hasten-example";
  bool units = false;        // declare sharding units (for zero/fsdp)
  double clip = 0;           // > 0: clip_grad_norm_ on every synchronising step
  std::string params_out;    // write the final full parameters (safetensors) here
  std::string trace_out;     // rank 0's gradients and parameters after every micro-batch (raw float32)
  int64_t checkpoint_every = 0;  // > 0: save_state every N steps (into project_dir/checkpoints)
  bool resume = false;           // continue from the newest complete checkpoint, if there is one
  hasten::Options options;
};

// Trains a.workload through hasten (a.impl "hasten") or the plain LibTorch loop ("libtorch");
// the local main process shows a hasten::ProgressBar on stderr unless a.quiet (so stdout keeps
// only the summary, one JSON line with a.json); rank 0 prints the summary and writes
// a.losses_out and a.params_out. Returns the process exit status; throws on errors.
int run(const Args& a);

}  // namespace hasten::examples
