// Detection of the process's place in the run from the launcher's environment.
#include <hasten/error.hpp>
#include <hasten/process.hpp>

#include <unistd.h>  // environ (glibc declares it with _GNU_SOURCE, which g++ defines)

#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace hasten {

Environment current_environment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

namespace {

struct EnvReader {
  const Environment& env;
  bool has(const char* k) const {
    auto it = env.find(k);
    return it != env.end() && !it->second.empty();
  }
  std::string str(const char* k, const std::string& def = "") const {
    auto it = env.find(k);
    return it == env.end() || it->second.empty() ? def : it->second;
  }
  int integer(const char* k, int def) const {
    if (!has(k)) return def;
    const std::string s = env.at(k);
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < 0 || v > 1 << 24)
      throw ConfigError("environment " + std::string(k) + "='" + s +
                        "' is not a non-negative integer");
    return static_cast<int>(v);
  }
};

// mpirun and srun give every rank of a job the same job id, and no port: the store's port is
// 15000 plus the id's last four digits (Lightning's rule for SLURM), so that `mpirun -np 2
// prog` and `srun -n 2 prog` run with nothing set. Two jobs on one machine whose ids end alike
// meet the same port; rank 0's store then fails to bind and says to set MASTER_PORT.
int port_from_job_id(const std::string& id) {
  size_t digits = 0;
  while (digits < 4 && digits < id.size() && std::isdigit(static_cast<unsigned char>(id[id.size() - 1 - digits])))
    ++digits;
  if (digits == 0) return 0;
  return 15000 + std::stoi(id.substr(id.size() - digits));
}

void check(const ProcessInfo& p, const std::string& source) {
  auto bad = [&](const std::string& what) {
    throw ConfigError("environment (" + source + "): " + what);
  };
  if (p.world_size < 1) bad("world size " + std::to_string(p.world_size) + " must be >= 1");
  if (p.rank >= p.world_size)
    bad("rank " + std::to_string(p.rank) + " must be below world size " +
        std::to_string(p.world_size));
  if (p.local_world_size < 1 || p.local_world_size > p.world_size)
    bad("local world size " + std::to_string(p.local_world_size) + " must be 1.." +
        std::to_string(p.world_size));
  if (p.local_rank >= p.local_world_size)
    bad("local rank " + std::to_string(p.local_rank) + " must be below local world size " +
        std::to_string(p.local_world_size));
}

}  // namespace

ProcessInfo detect_process_info(const Environment& env) {
  EnvReader r{env};
  ProcessInfo p;
  p.master_addr = r.str("MASTER_ADDR", "127.0.0.1");
  p.master_port = r.integer("MASTER_PORT", 0);
  if (r.has("RANK") || r.has("WORLD_SIZE")) {
    // hasten launch and torchrun: the torchrun contract.
    if (!r.has("RANK") || !r.has("WORLD_SIZE"))
      throw ConfigError("environment: RANK and WORLD_SIZE must be set together");
    p.launcher = r.has("HASTEN_LAUNCHED") ? "hasten" : r.has("TORCHELASTIC_RUN_ID") ? "torchrun" : "env";
    p.rank = r.integer("RANK", 0);
    p.world_size = r.integer("WORLD_SIZE", 1);
    p.local_rank = r.integer("LOCAL_RANK", p.rank);
    p.local_world_size = r.integer("LOCAL_WORLD_SIZE", p.world_size);
    p.num_nodes = p.local_world_size > 0 ? p.world_size / p.local_world_size : 1;
    p.node_rank = r.integer("GROUP_RANK", p.local_world_size > 0 ? p.rank / p.local_world_size : 0);
    check(p, p.launcher);
  } else if (r.has("SLURM_PROCID") && r.has("SLURM_NTASKS") &&
             (r.has("SLURM_STEP_ID") || r.has("SLURM_STEPID"))) {
    // srun: one task per process. (A bare salloc shell has SLURM_PROCID but no step.)
    p.launcher = "slurm";
    p.rank = r.integer("SLURM_PROCID", 0);
    p.world_size = r.integer("SLURM_NTASKS", 1);
    p.local_rank = r.integer("SLURM_LOCALID", 0);
    p.num_nodes = r.integer("SLURM_NNODES", r.integer("SLURM_JOB_NUM_NODES", 1));
    p.node_rank = r.integer("SLURM_NODEID", 0);
    p.local_world_size = p.num_nodes > 0 ? p.world_size / p.num_nodes : p.world_size;
    if (!r.has("MASTER_ADDR")) p.master_addr = r.str("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1");
    if (!r.has("MASTER_PORT") && (p.master_port = port_from_job_id(r.str("SLURM_JOB_ID"))) > 0)
      p.master_port_source = "SLURM_JOB_ID " + r.str("SLURM_JOB_ID");
    check(p, "SLURM");
  } else if (r.has("OMPI_COMM_WORLD_RANK") && r.has("OMPI_COMM_WORLD_SIZE")) {
    p.launcher = "openmpi";
    p.rank = r.integer("OMPI_COMM_WORLD_RANK", 0);
    p.world_size = r.integer("OMPI_COMM_WORLD_SIZE", 1);
    p.local_rank = r.integer("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    p.local_world_size = r.integer("OMPI_COMM_WORLD_LOCAL_SIZE", p.world_size);
    p.num_nodes = p.local_world_size > 0 ? p.world_size / p.local_world_size : 1;
    p.node_rank = p.local_world_size > 0 ? p.rank / p.local_world_size : 0;
    if (!r.has("MASTER_PORT") && (p.master_port = port_from_job_id(r.str("OMPI_MCA_ess_base_jobid"))) > 0)
      p.master_port_source = "the MPI job id " + r.str("OMPI_MCA_ess_base_jobid");
    // Rank 0's machine is not in mpirun's environment: across machines it must be given.
    if (p.num_nodes > 1 && !r.has("MASTER_ADDR"))
      throw ConfigError("environment (OpenMPI): this run spans " + std::to_string(p.num_nodes) +
                        " machines and MASTER_ADDR is not set: give rank 0's machine (mpirun -x MASTER_ADDR=HOST)");
    check(p, "OpenMPI");
  }
  return p;
}

std::vector<int> parse_gpu_ids(const std::string& gpu_ids) {
  std::vector<int> ids;
  if (gpu_ids == "all") return ids;
  auto bad = [&](const std::string& why) {
    return ConfigError("gpu_ids: '" + gpu_ids + "' " + why + " (allowed: all, or a comma list of GPU ordinals such as 0,1)");
  };
  size_t start = 0;
  while (start <= gpu_ids.size()) {
    const size_t comma = gpu_ids.find(',', start);
    std::string item = gpu_ids.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty() || item.size() > 4 || item.find_first_not_of("0123456789") != std::string::npos)
      throw bad("is not a list of GPU ordinals");
    const int id = std::stoi(item);
    for (int seen : ids)
      if (seen == id) throw bad("names GPU " + item + " twice");
    ids.push_back(id);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

bool gpu_bound_per_process(const Environment& env, int local_world_size) {
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  return local_world_size > 1 && it != env.end() && !it->second.empty() && it->second.find(',') == std::string::npos;
}

int select_cuda_device(const std::string& gpu_ids, int local_rank, int local_world_size, int visible,
                       bool bound_per_process) {
  const std::vector<int> ids = parse_gpu_ids(gpu_ids);
  if (bound_per_process && ids.empty() && visible >= 1) return 0;  // this process's own GPU
  const int usable = ids.empty() ? visible : static_cast<int>(ids.size());
  if (local_world_size > usable) {
    throw ConfigError("this machine runs " + std::to_string(local_world_size) + " processes but has " +
                      std::to_string(usable) + (ids.empty() ? " visible GPU" : " GPU") + (usable == 1 ? "" : "s") +
                      (ids.empty() ? "" : " in gpu_ids '" + gpu_ids + "'") +
                      ": two ranks would share a GPU (allowed: at most one process per GPU; fewer processes, "
                      "more gpu_ids, or use_cpu)");
  }
  if (local_rank < 0 || local_rank >= usable)
    throw ConfigError("local rank " + std::to_string(local_rank) + " has no GPU: " + std::to_string(usable) +
                      " usable (gpu_ids '" + gpu_ids + "')");
  const int device = ids.empty() ? local_rank : ids[static_cast<size_t>(local_rank)];
  if (device >= visible)
    throw ConfigError("gpu_ids: GPU " + std::to_string(device) + " is not visible (" + std::to_string(visible) +
                      " visible GPU" + (visible == 1 ? "" : "s") + ", ordinals 0.." + std::to_string(visible - 1) +
                      " after CUDA_VISIBLE_DEVICES)");
  return device;
}

}  // namespace hasten
