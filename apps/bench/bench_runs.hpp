// The benchmark runs that train or communicate through hasten (bench_runs.cpp), apart from
// hasten-bench's command line (bench.cpp): an edit of hasten's headers recompiles these, not
// CLI11's (~8 s at -O3).
#pragma once

#include <cstdint>
#include <string>

namespace hasten::bench {

// One benchmark mode: processes, strategy, precision, accumulation, and whether the workload's
// layers are declared units (the sharding strategies shard by unit).
struct Mode {
  std::string name;
  int world;
  std::string strategy;
  std::string precision;
  int accumulation;
  bool units;
};

// --collectives: allreduce, allgather and reduce_scatter of 4 KiB to max_bytes per rank through
// the comm plugin `comm` on 2 processes, each beside its memcpy bound; one JSON line each.
void collectives(const std::string& comm, int64_t max_bytes);

// --checkpoints: save_state and load_state of `workload` in `mode` under `dir`, against plain
// sequential file I/O of the same bytes; one JSON line.
void checkpoints(const std::string& workload, const Mode& mode, const std::string& dir);

// --data-workers: a data-bound loop (a dataset whose get() costs a fixed amount of CPU, its
// cost measured in the run) read with num_workers 0, 1 and 2; one JSON line each, samples/s.
void data_workers(int64_t batches, int rounds);

}  // namespace hasten::bench
