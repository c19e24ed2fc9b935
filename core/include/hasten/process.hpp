// Where this process sits in a run, read from the environment that a launcher set: hasten
// launch and torchrun (RANK, WORLD_SIZE, LOCAL_RANK...), SLURM (SLURM_PROCID...) or OpenMPI
// (OMPI_COMM_WORLD_*). docs/launch.md has the detection table.
#pragma once

#include <map>
#include <string>
#include <vector>

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
  // Where master_port came from when no MASTER_PORT was set ("" otherwise): mpirun's and
  // srun's job id (process_info.cpp), named in the store's errors.
  std::string master_port_source;
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

// The GPU of this process: its ordinal among the `visible` devices (after CUDA_VISIBLE_DEVICES).
// gpu_ids is the config key: "all" gives local rank r the r-th visible GPU; a comma list
// ("1,3") gives it the r-th listed ordinal (`hasten launch` turns the list into
// CUDA_VISIBLE_DEVICES for its workers, as `accelerate launch` does, and hands them "all").
// One GPU per process: throws ConfigError, with one line, when gpu_ids is malformed, names a
// GPU that is not visible or twice, or when the machine runs more processes
// (local_world_size) than it has GPUs for (two ranks would share a GPU, which NCCL refuses).
// bound_per_process: the launcher gave each process its own GPU through CUDA_VISIBLE_DEVICES
// (`srun --gpus-per-task=1`: one visible GPU per process, whatever the local rank): gpu_ids
// "all" then takes visible GPU 0.
int select_cuda_device(const std::string& gpu_ids, int local_rank, int local_world_size, int visible,
                       bool bound_per_process = false);

// Whether CUDA_VISIBLE_DEVICES, as env holds it, binds one GPU to this process alone: it names
// exactly one device while this machine runs several processes.
bool gpu_bound_per_process(const Environment& env, int local_world_size);

// gpu_ids parsed: an empty list for "all". Throws ConfigError on anything else than "all" or
// a comma list of distinct non-negative integers.
std::vector<int> parse_gpu_ids(const std::string& gpu_ids);

}  // namespace hasten
