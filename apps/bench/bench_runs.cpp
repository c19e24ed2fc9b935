// hasten-bench's runs through hasten: the collectives against their copy bound, checkpoints
// against plain file I/O (see bench_runs.hpp).
#include "bench_runs.hpp"

#include <hasten/hasten.hpp>

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

#include "workloads.hpp"

namespace hasten::bench {
namespace {

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

}  // namespace

void collectives(const std::string& comm, int64_t max_bytes) {
  auto body = [comm, max_bytes] {
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
  };
  // Under mpirun (`mpirun -np 2 hasten-bench --collectives --comm mpi`: the mpi plugin needs
  // processes mpirun started) this process is a rank already; otherwise 2 ranks are forked.
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
    ::setenv("HASTEN_COMM", comm.c_str(), 1);
    body();
    return;
  }
  hasten::LaunchOptions lo;
  lo.num_processes = 2;
  lo.env["HASTEN_COMM"] = comm;
  hasten::launch(body, lo);
}

namespace {

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

}  // namespace

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

namespace {

// A dataset whose get() costs a fixed amount of CPU work per sample (as decoding an image or
// tokenising a line would), the same on every thread: `rounds` passes of a multiply-add over
// 4 KiB, ending in a value that depends on the index.
struct Decoding {
  int64_t n = 0;
  int rounds = 0;
  size_t size() const { return static_cast<size_t>(n); }
  torch::data::Example<> get(size_t i) const {
    std::vector<float> buf(1024, static_cast<float>(i % 97));
    for (int r = 0; r < rounds; ++r)
      for (auto& v : buf) v = v * 1.0001f + 0.5f;
    return {torch::from_blob(buf.data(), {16}).clone(), torch::tensor(static_cast<int64_t>(i % 10))};
  }
};

}  // namespace

void data_workers(int64_t batches, int rounds) {
  using Clock = std::chrono::steady_clock;
  constexpr int64_t kBatch = 32;
  const Decoding dataset{batches * kBatch, rounds};
  // The measured cost of one get(), on the calling thread.
  const int64_t probe = 256;
  auto t0 = Clock::now();
  float sink = 0;
  for (int64_t i = 0; i < probe; ++i) sink += dataset.get(static_cast<size_t>(i)).data[0].item<float>();
  const double get_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / probe;
  for (int workers : {0, 1, 2}) {
    hasten::DataLoaderOptions o;
    o.batch_size = kBatch;
    o.shuffle = true;
    o.num_workers = workers;
    hasten::DataLoader loader(dataset, o);
    double checksum = 0;
    int64_t samples = 0;
    t0 = Clock::now();
    for (auto& b : loader) {  // the "step": a reduction of the batch, far cheaper than reading it
      checksum += b.input.sum().item<double>();
      samples += b.size();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    std::cout << nlohmann::json{{"impl", "hasten"},         {"bench", "data_workers"},
                                {"num_workers", workers},    {"batch_size", kBatch},
                                {"samples", samples},        {"get_us", get_us},
                                {"seconds", seconds},        {"samples_per_s", samples / seconds},
                                {"checksum", checksum + sink * 0}}
                     .dump()
              << std::endl;
  }
}

}  // namespace hasten::bench
