// hasten-bench: runs the workloads of docs/workloads.md in every mode, through hasten
// (--impl hasten) and through the plain LibTorch loop (--impl libtorch: single and bf16 only,
// no hasten code in the step, same binary and build flags), one JSON line per run with the
// fields torch_peer.py prints (plus the memory report). Every run is a fresh set of worker
// processes (hasten::launch), so one run's threads and peak memory never leak into the next.
// With --collectives it times allreduce, allgather and reduce_scatter of 4 KiB to 64 MiB per
// rank through the comm plugins (into preallocated outputs), each beside its copy bound: a
// plain memcpy of the bytes each rank must move, timed in the same run; with --checkpoints
// DIR, save_state and load_state against plain sequential file I/O of the same bytes; with
// --max-model, the largest gpt-style model ddp, zero3 and PyTorch DDP train on 2 processes
// within a memory budget (max_model.cpp).
//
//   hasten-bench --workload mlp-small --mode ddp2 zero3 --impl hasten
//   hasten-bench --collectives --comm shm gloo
//   mpirun -np 2 hasten-bench --collectives --comm mpi     (the mpi plugin runs under mpirun only)
#include <hasten/error.hpp>
#include <hasten/launch.hpp>
#include <hasten/runtime_info.hpp>

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "../cli_checks.hpp"
#include "../error_line.hpp"
#include "bench_runs.hpp"
#include "big_model.hpp"
#include "max_model.hpp"
#include "runner.hpp"
#include "workloads.hpp"

namespace {

using hasten::bench::Mode;


const std::vector<Mode>& modes() {
  static const std::vector<Mode> m = {
      {"single", 1, "single", "no", 1, false}, {"bf16", 1, "single", "bf16", 1, false},
      {"ddp2", 2, "ddp", "no", 1, false},      {"ddp2-accum4", 2, "ddp", "no", 4, false},
      {"zero1", 2, "zero1", "no", 1, true},    {"zero2", 2, "zero2", "no", 1, true},
      {"zero3", 2, "zero3", "no", 1, true},    {"fsdp", 2, "fsdp", "no", 1, true},
  };
  return m;
}

// One intra-op thread per process, and (with an OpenBLAS) the kernel `hasten launch` would choose:
// the BLAS reads both when it loads, so the bench re-executes itself once with them set.
void prepare_environment(char** argv) {
  if (std::getenv("HASTEN_BENCH_READY")) return;
  ::setenv("HASTEN_BENCH_READY", "1", 1);
  if (!std::getenv("OMP_NUM_THREADS")) ::setenv("OMP_NUM_THREADS", "1", 1);
  if (!std::getenv("OPENBLAS_NUM_THREADS")) ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
  if (!std::getenv("OPENBLAS_CORETYPE")) {
    const auto advice = hasten::openblas_coretype_advice();
    if (!advice.coretype.empty()) {
      std::cerr << "hasten-bench: " << advice.reason << "; using OPENBLAS_CORETYPE=" << advice.coretype << std::endl;
      ::setenv("OPENBLAS_CORETYPE", advice.coretype.c_str(), 1);
    }
  }
  ::execv("/proc/self/exe", argv);
  std::cerr << "hasten-bench: warning: cannot re-execute with the benchmark environment" << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  prepare_environment(argv);
  std::vector<std::string> workloads = hasten::workloads::names(), mode_names, impls = {"hasten", "libtorch"};
  std::vector<std::string> comms = {"shm", "gloo"};
  int64_t steps = -1, warmup = 10, max_bytes = 64ll << 20;
  bool run_collectives = false, print_blas_env = false, quiet = false;
  CLI::App app{"hasten-bench: time the benchmark workloads through hasten and the plain LibTorch loop"};
  app.add_option("--workload", workloads, "Workloads (default: all)");
  app.add_option("--mode", mode_names, "Modes: single bf16 ddp2 ddp2-accum4 zero1 zero2 zero3 fsdp (default: all)");
  app.add_option("--impl", impls, "hasten, libtorch (default: both)");
  app.add_option("--steps", steps, "Timed steps (default: the workload's S)")
      ->check(hasten::cli::integer_in(0, 100'000'000));
  app.add_option("--warmup", warmup, "Untimed steps first")->check(hasten::cli::integer_in(0, 100'000'000));
  app.add_flag("--collectives", run_collectives, "Time the comm plugins' collectives instead");
  app.add_option("--comm", comms, "Comm plugins for --collectives (default: shm gloo)");
  app.add_option("--max-bytes", max_bytes, "Largest collective buffer (default 64 MiB)")
      ->check(hasten::cli::integer_in(4096, 1ll << 34));
  app.add_flag("--quiet,-q", quiet, "No progress bar on stderr during the workload runs");
  app.add_flag("--print-blas-env", print_blas_env, "Print the BLAS settings the runs use, and exit");
  int processes = 0;
  app.add_option("--processes", processes, "Processes of the multi-process modes (default: 2)")
      ->check(hasten::cli::integer_in(2, 64));
  hasten::bench::MaxModelOptions mm;
  bool max_model = false;
  double budget_mib = 8192;
  app.add_flag("--max-model", max_model,
               "Find the largest gpt-style model each side trains for 3 steps on 2 processes within --budget-mib");
  app.add_option("--budget-mib", budget_mib, "--max-model: summed peak resident memory of both processes (default 8192)")
      ->check(CLI::Range(64.0, 1048576.0));
  app.add_option("--sides", mm.sides, "--max-model: ddp2 zero3 torch-ddp2 (default: all three)")
      ->check(CLI::IsMember({"ddp2", "zero3", "torch-ddp2"}));
  app.add_option("--max-size", mm.max_size, "--max-model: largest size tried (width 32 s, depth s/2; default 128)")
      ->check(hasten::cli::integer_in(1, 1024));
  app.add_option("--start-size", mm.start_size,
                 "--max-model: first size tried, doubled while it fits or halved until one does (default 1)")
      ->check(hasten::cli::integer_in(1, 1024));
  app.add_option("--peer", mm.peer, "--max-model: the PyTorch peer (default: the source tree's torch_peer.py)");
  app.add_option("--python", mm.python, "--max-model: torch-ddp2's interpreter (default: $HASTEN_BENCH_PYTHON, else python3 on PATH)");
  std::string trial_mode;
  int trial_size = 0;
  app.add_option("--max-model-trial", trial_mode)->group("")->check(CLI::IsMember({"ddp2", "zero3"}));
  app.add_option("--max-model-size", trial_size)->group("")->check(hasten::cli::integer_in(1, 1024));
  app.add_option("--max-model-seq", mm.seq)->group("")->check(hasten::cli::integer_in(1, 4096));
  app.add_option("--max-model-batch", mm.batch)->group("")->check(hasten::cli::integer_in(1, 4096));
  bool data_bound = false;
  app.add_flag("--data-workers", data_bound,
               "Time a data-bound loop (get() costs a fixed, measured amount) with DataLoader num_workers 0, 1 and 2");
  std::string big_save, big_side, big_dir;
  double big_budget_mib = 100;
  app.add_option("--big-model-save", big_save, "Write the big-model rows' weights into this directory, and exit");
  app.add_option("--big-model-run", big_side, "Big-model inference: whole (every module in memory) or offload")
      ->check(CLI::IsMember({"whole", "offload"}));
  app.add_option("--big-model-dir", big_dir, "--big-model-run: the directory --big-model-save wrote");
  app.add_option("--big-model-budget-mib", big_budget_mib, "--big-model-run offload: the CPU's share of the weights (MiB)")
      ->check(hasten::cli::finite_in(1, 1e9));
  std::string checkpoint_dir;
  app.add_option("--checkpoints", checkpoint_dir,
                 "Time save_state/load_state against plain file I/O in this directory instead (modes: default ddp2 zero3)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {  // one line, as the other programs print it
    std::cerr << "hasten-bench: error: " << e.what() << std::endl;
    return 2;
  }
  if (print_blas_env) {
    for (const char* k : {"OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"})
      if (const char* v = std::getenv(k)) std::cout << k << "=" << v << "\n";
    std::cout << "# " << hasten::blas_info().summary() << std::endl;
    return 0;
  }
  try {
    if (!big_save.empty()) {
      hasten::bench::big_model_save(big_save);
      return 0;
    }
    if (!big_side.empty()) {
      if (big_dir.empty()) {
        std::cerr << "hasten-bench: error: --big-model-run needs --big-model-dir (where --big-model-save wrote)" << std::endl;
        return 2;
      }
      hasten::bench::big_model_run(big_side, big_dir, big_budget_mib);
      return 0;
    }
    if (!trial_mode.empty()) {
      hasten::bench::max_model_trial(trial_mode, trial_size > 0 ? trial_size : 1, mm.seq, mm.batch);
      return 0;
    }
    if (max_model) {
      if (mm.start_size > mm.max_size) {
        std::cerr << "hasten-bench: error: --start-size " << mm.start_size << " is above --max-size " << mm.max_size
                  << " (the search tries sizes 1 to --max-size)" << std::endl;
        return 2;
      }
      mm.budget_bytes = static_cast<uint64_t>(budget_mib * 1048576.0);
      mm.self = "/proc/self/exe";
      if (mm.peer.empty()) mm.peer = HASTEN_BENCH_PEER;
      char self[4096];
      const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
      if (n > 0) mm.self.assign(self, static_cast<size_t>(n));
      return hasten::bench::max_model(mm);
    }
    if (!checkpoint_dir.empty()) {
      if (mode_names.empty()) mode_names = {"ddp2", "zero3"};
      for (auto& w : workloads)
        for (auto& name : mode_names) {
          auto it = std::find_if(modes().begin(), modes().end(), [&](const Mode& m) { return m.name == name; });
          if (it == modes().end()) throw hasten::Error("unknown mode '" + name + "'");
          const std::string dir = checkpoint_dir + "/" + w + "-" + name;
          std::filesystem::remove_all(dir);
          hasten::bench::checkpoints(w, *it, dir);
          std::filesystem::remove_all(dir);
        }
      return 0;
    }
    if (data_bound) {
      hasten::bench::data_workers(/*batches=*/40, /*rounds=*/5000);
      return 0;
    }
    if (run_collectives) {
      for (auto& c : comms) hasten::bench::collectives(c, max_bytes);
      return 0;
    }
    if (mode_names.empty())
      for (auto& m : modes()) mode_names.push_back(m.name);
    int failures = 0;
    for (auto& w : workloads) {
      hasten::workloads::spec(w);  // validates the name
      for (auto& name : mode_names) {
        auto it = std::find_if(modes().begin(), modes().end(), [&](const Mode& m) { return m.name == name; });
        if (it == modes().end()) {
          std::cerr << "hasten-bench: error: unknown mode '" << name << "'" << std::endl;
          return 2;
        }
        for (auto& impl : impls) {
          if (impl == "libtorch" && it->world != 1) continue;  // the plain loop is one process
          hasten::examples::Args a;
          a.workload = w;
          a.impl = impl;
          a.mode = it->name;
          a.steps = steps;
          a.warmup = warmup;
          a.json = true;
          a.log_every = 0;
          a.quiet = quiet;
          a.units = it->units;
          a.options.strategy = it->strategy;
          a.options.mixed_precision = it->precision;
          if (it->accumulation > 1) a.options.gradient_accumulation_steps = it->accumulation;
          hasten::LaunchOptions lo;
          lo.num_processes = it->world > 1 && processes > 0 ? processes : it->world;
          lo.timeout_s = 3600;
          try {
            hasten::launch([a] { hasten::examples::run(a); }, lo);
          } catch (const std::exception& e) {
            std::cerr << "hasten-bench: error: " << w << " " << name << " " << impl << ": " << hasten::cli::error_line(e) << std::endl;
            ++failures;
          }
        }
      }
    }
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "hasten-bench: error: " << hasten::cli::error_line(e) << std::endl;
    return 1;
  }
}
