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
#include <hasten/hasten.hpp>
#include <hasten/runtime_info.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

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
#include "max_model.hpp"
#include "runner.hpp"
#include "workloads.hpp"

namespace {

struct Mode {
  std::string name;
  int world;
  std::string strategy;
  std::string precision;
  int accumulation;
  bool units;
};

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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The bytes one rank must move in a collective of `bytes` per rank on `world` ranks, as a plain
// memcpy would move them: an allgather writes world x bytes of output, a reduce_scatter reads
// world slices (its whole input), an allreduce rewrites its buffer.
int64_t copy_bytes(const std::string& op, int64_t bytes, int world) {
  return op == "allgather" ? bytes * world : bytes;
}

void collectives(const std::string& comm, int64_t max_bytes) {
  hasten::LaunchOptions lo;
  lo.num_processes = 2;
  lo.env["HASTEN_COMM"] = comm;
  hasten::launch(
      [comm, max_bytes] {
        hasten::Accelerator acc;
        using Clock = std::chrono::steady_clock;
        const int world = acc.num_processes();
        for (const std::string op : {"allreduce", "allgather", "reduce_scatter"}) {
          for (int64_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
            const int64_t n = bytes / 4;
            // Every buffer is allocated and touched once, outside the timing: a collective
            // into a fresh tensor would time the kernel's page faults, not the collective.
            auto t = torch::ones({n});
            auto gathered = torch::zeros({n * world});
            auto scattered = torch::zeros({n / world});
            const int64_t copy = copy_bytes(op, bytes, world);
            auto copy_src = torch::ones({copy / 4}), copy_dst = torch::zeros({copy / 4});
            auto run_once = [&] {
              if (op == "allreduce")
                acc.all_reduce_(t, hasten::ReduceOp::Sum).wait();
              else if (op == "allgather")
                acc.all_gather_into(gathered, t);
              else
                acc.reduce_scatter_into(scattered, t, hasten::ReduceOp::Sum);
            };
            auto seconds = [](auto&& f) {
              const auto t0 = Clock::now();
              f();
              return std::chrono::duration<double>(Clock::now() - t0).count();
            };
            // Wall and CPU seconds of the calling thread (shm's waits sleep on a futex after a
            // 100 us spin, so its CPU time is the copying and reducing, not the waiting for a
            // core: on a machine with more runnable processes than cores that is the figure
            // the load leaves alone).
            auto wall_and_cpu = [](auto&& f) {
              timespec c0{}, c1{};
              ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
              const auto t0 = Clock::now();
              f();
              const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
              ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
              return std::pair<double, double>{wall, (c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9};
            };
            double each = 0;
            for (int i = 0; i < 3; ++i) each += seconds(run_once) / 3;
            // Every rank must run the same number of iterations: agree on the largest wish
            // (about 0.3 s of work, 5 to 200 iterations).
            const int64_t wish = std::clamp<int64_t>(static_cast<int64_t>(0.3 / std::max(each, 1e-7)), 5, 200);
            const int64_t iterations = acc.reduce(torch::tensor({wish}), "max").item<int64_t>();
            // The copy bound: every rank copies its bytes at the same moment, as in the
            // collective, interleaved with it so that both see the same machine.
            std::vector<double> times, copies, cpu_times, cpu_copies;
            for (int64_t i = 0; i < iterations; ++i) {
              acc.wait_for_everyone();
              const auto c = wall_and_cpu([&] { std::memcpy(copy_dst.data_ptr(), copy_src.data_ptr(), static_cast<size_t>(copy)); });
              copies.push_back(c.first);
              cpu_copies.push_back(c.second);
              acc.wait_for_everyone();
              const auto t = wall_and_cpu(run_once);
              times.push_back(t.first);
              cpu_times.push_back(t.second);
            }
            // The slowest rank decides.
            auto slowest = [&](double mine) { return acc.reduce(torch::tensor({mine}, torch::kDouble), "max").item<double>(); };
            const double took = slowest(median(times)), bound = slowest(median(copies));
            const double cpu_took = slowest(median(cpu_times)), cpu_bound = slowest(median(cpu_copies));
            if (acc.is_main_process())
              std::cout << nlohmann::ordered_json{{"impl", "hasten"}, {"comm", comm}, {"op", op}, {"bytes", bytes},
                                                  {"median_ms", took * 1e3}, {"gb_per_s", bytes / took / 1e9},
                                                  {"copy_bytes", copy}, {"copy_ms", bound * 1e3},
                                                  {"vs_copy", took / bound}, {"cpu_ms", cpu_took * 1e3},
                                                  {"copy_cpu_ms", cpu_bound * 1e3},
                                                  {"cpu_vs_copy", cpu_bound > 0 ? cpu_took / cpu_bound : 0.0},
                                                  {"iterations", times.size()},
                                                  {"world_size", world}}
                               .dump()
                        << std::endl;
          }
        }
      },
      lo);
}

// Bytes of every file under dir.
uint64_t bytes_under(const std::filesystem::path& dir) {
  uint64_t total = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) total += e.file_size();
  return total;
}

// Seconds to write `write_bytes` sequentially into a new file and fsync it, then to read
// `read_bytes` of it back into memory that holds them (allocated and touched beforehand, as a
// model's parameters and optimizer state are): the plain file I/O a checkpoint is compared
// with, on the same disk. A file shorter than read_bytes is first extended, untimed.
std::pair<double, double> plain_io(const std::filesystem::path& file, uint64_t write_bytes, uint64_t read_bytes) {
  using Clock = std::chrono::steady_clock;
  std::vector<char> buf(8 << 20, 1);
  auto write_part = [&](int fd, uint64_t bytes) {
    for (uint64_t left = bytes; left > 0;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
      if (::write(fd, buf.data(), n) != static_cast<ssize_t>(n)) throw hasten::Error("write failed: '" + file.string() + "'");
      left -= n;
    }
    ::fsync(fd);
  };
  auto t0 = Clock::now();
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw hasten::Error("cannot write '" + file.string() + "'");
  write_part(fd, write_bytes);
  const double write_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (read_bytes > write_bytes) write_part(fd, read_bytes - write_bytes);
  ::close(fd);
  std::vector<char> dst(static_cast<size_t>(read_bytes), 0);  // touched: its pages exist, as the state's do
  t0 = Clock::now();
  const int in = ::open(file.c_str(), O_RDONLY);
  for (uint64_t done = 0; done < read_bytes;) {
    const ssize_t n = ::read(in, dst.data() + done, static_cast<size_t>(std::min<uint64_t>(read_bytes - done, 8 << 20)));
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  ::close(in);
  const double read_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::filesystem::remove(file);
  return {write_s, read_s};
}

// save_state and load_state of a workload after one training step (so that the optimizer has
// state), against plain sequential I/O of the same bytes; the slowest rank decides.
void checkpoints(const std::string& workload, const Mode& mode, const std::string& dir) {
  hasten::LaunchOptions lo;
  lo.num_processes = mode.world;
  lo.timeout_s = 3600;
  hasten::launch(
      [&] {
        namespace W = hasten::workloads;
        using Clock = std::chrono::steady_clock;
        hasten::Options o;
        o.strategy = mode.strategy;
        o.project_dir = dir;
        hasten::Accelerator acc(o);
        torch::manual_seed(0);
        auto model = W::build_model(workload, mode.units);
        torch::optim::AdamW optimizer(model->parameters(), W::optimizer_options());
        auto [inputs, targets] = W::build_data(workload);
        auto [net, opt] = acc.prepare(model, optimizer);
        const int64_t b = W::spec(workload).batch;
        acc.backward(W::loss(workload, net(W::model_input(workload, inputs.narrow(0, 0, b))), targets.narrow(0, 0, b)));
        opt.step();
        auto slowest = [&](double s) { return acc.reduce(torch::tensor({s}, torch::kDouble), "max").item<double>(); };
        std::vector<double> saves, loads;
        std::string last;
        for (int i = 0; i < 3; ++i) {
          acc.wait_for_everyone();
          auto t0 = Clock::now();
          last = acc.save_state();
          saves.push_back(slowest(std::chrono::duration<double>(Clock::now() - t0).count()));
          acc.wait_for_everyone();
          t0 = Clock::now();
          acc.load_state(last);
          loads.push_back(slowest(std::chrono::duration<double>(Clock::now() - t0).count()));
        }
        const uint64_t bytes = bytes_under(last);
        // Each rank writes its share of the checkpoint's bytes and reads back the bytes it
        // must load: the state it holds (parameters or their shards, and optimizer state),
        // all of it under ddp (every rank holds everything), its shards under zero/fsdp.
        const hasten::MemoryReport held = acc.memory_report();
        const uint64_t must_load = held.params + held.param_shards + held.optimizer;
        const auto [write_s, read_s] = plain_io(std::filesystem::path(dir) / (".plain" + std::to_string(acc.process_index())),
                                                bytes / static_cast<uint64_t>(acc.num_processes()), must_load);
        const uint64_t most_load = static_cast<uint64_t>(slowest(static_cast<double>(must_load)));
        const double plain_write = slowest(write_s), plain_read = slowest(read_s);
        const double save = median(saves), load = median(loads);
        if (acc.is_main_process())
          std::cout << nlohmann::ordered_json{{"impl", "hasten"}, {"bench", "checkpoint"}, {"workload", workload},
                                              {"mode", mode.name}, {"bytes", bytes}, {"load_bytes_per_rank", most_load}, {"save_s", save}, {"load_s", load},
                                              {"plain_write_s", plain_write}, {"plain_read_s", plain_read},
                                              {"save_vs_plain", plain_write / save}, {"load_vs_plain", plain_read / load}}
                           .dump()
                    << std::endl;
      },
      lo);
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
          checkpoints(w, *it, dir);
          std::filesystem::remove_all(dir);
        }
      return 0;
    }
    if (run_collectives) {
      for (auto& c : comms) collectives(c, max_bytes);
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
