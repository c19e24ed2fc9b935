// Where this process sits in a run, read from the environment that a launcher set: hasten
// launch and torchrun (RANK, WORLD_SIZE, LOCAL_RANK...), SLURM (SLURM_PROCID...) or OpenMPI
// (OMPI_COMM_WORLD_*). docs/launch.md has the detection table.
#pragma once

#include <map>
#include <string>

namespace hasten {

struct ProcessInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;        // 0: none given
  std::string launcher = "none";  // none, hasten, torchrun, slurm, openmpi

  bool is_main_process() const { return rank == 0; }
  bool is_local_main_process() const { return local_rank == 0; }
  bool distributed() const { return world_size > 1; }
};

using Environment = std::map<std::string, std::string>;

// The current process environment as a map.
Environment current_environment();

// Reads the process information from env. Throws ConfigError on inconsistent values
// (RANK >= WORLD_SIZE, a non-numeric RANK...).
ProcessInfo detect_process_info(const Environment& env);

}  // namespace hasten
