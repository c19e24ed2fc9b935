// save_on_each_node: which rank writes each machine's copy of a checkpoint, the model's full
// tensors passed to those ranks, and each machine's view of the checkpoints load_state finds.
#include "checkpoint/checkpoint_machines.hpp"

#include <hasten/error.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <random>

#include "checkpoint/checkpoint_files.hpp"

namespace hasten::detail {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// machine -> its lowest rank, from every rank's node_rank (collective). The launchers number
// ranks machine by machine, but SLURM's or MPI's placement need not: each rank says where it is.
std::map<int, int> machine_writers(Engine& engine, const ProcessInfo& process) {
  torch::Tensor node = torch::zeros({process.world_size}, torch::kDouble);
  node[process.rank] = static_cast<double>(process.node_rank);
  node = engine.reduce(node, "sum");
  std::map<int, int> writers;
  for (int r = 0; r < process.world_size; ++r) writers.emplace(static_cast<int>(node[r].item<double>()), r);  // first wins
  return writers;
}

std::string random_token() {
  std::random_device device;
  std::string token;
  for (int i = 0; i < 4; ++i) {
    char part[9];
    std::snprintf(part, sizeof part, "%08x", static_cast<unsigned>(device()));
    token += part;
  }
  return token;
}

}  // namespace

MachineCopies prepare_machine_copies(Engine& engine, const ProcessInfo& process, const fs::path& target,
                                     bool refuse_existing) {
  const std::map<int, int> writer_of = machine_writers(engine, process);
  const fs::path tmp = saving_dir(target);
  // One token per save: a machine that finds it in its temporary directory's mark shares
  // that directory (and so the file system) with a machine before it.
  const std::string token = engine.broadcast(process.rank == 0 ? random_token() : std::string(), 0);
  std::map<int, int> copy_of;  // machine -> the writer of the copy its ranks' files go into
  std::vector<std::string> errors;
  for (auto [machine, first] : writer_of) {
    std::string outcome;
    if (process.rank == first) {
      try {
        const std::string owner = saving_owner(tmp);
        if (owner.rfind(token + " rank ", 0) == 0) {
          outcome = "shared:" + owner.substr(token.size() + 6);
        } else {
          std::error_code ec;
          if (refuse_existing && fs::exists(fs::symlink_status(target, ec)))
            throw Error("save_state: '" + target.string() +
                        "' already exists (a run that continues calls load_state() first; new checkpoints are then "
                        "numbered after the newest one)");
          prepare_save(target, token + " rank " + std::to_string(process.rank));
          outcome = "ok";
        }
      } catch (const std::exception& e) {
        outcome = std::string("error:") + e.what();
      }
    }
    outcome = engine.broadcast(outcome, first);
    if (outcome == "ok") {
      copy_of[machine] = first;
    } else if (outcome.rfind("shared:", 0) == 0) {
      copy_of[machine] = std::stoi(outcome.substr(7));  // written by this process, a writer before it
    } else {
      std::string why = outcome.substr(outcome.find(':') + 1);
      if (why.rfind("save_state: ", 0) == 0) why = why.substr(12);
      errors.push_back("on machine " + std::to_string(machine) + ": " + why);
      copy_of[machine] = -1;
    }
  }
  MachineCopies out;
  for (auto& [machine, w] : copy_of)
    if (w >= 0 && w == writer_of.at(machine)) out.writers.push_back(w);
  std::sort(out.writers.begin(), out.writers.end());
  out.writer = std::count(out.writers.begin(), out.writers.end(), process.rank) > 0;
  if (!errors.empty()) {
    std::error_code ec;
    if (out.writer) fs::remove_all(tmp, ec);  // nothing was saved: no staging directory is left behind
    throw Error("save_state: " + errors.front() + " (save_on_each_node: every machine writes its own copy)");
  }
  // Every rank of machine m writes into copy_of[m]'s directory: the writer's list is theirs.
  torch::Tensor place = torch::zeros({process.world_size}, torch::kDouble);
  place[process.rank] = static_cast<double>(copy_of.at(process.node_rank));
  place = engine.reduce(place, "sum");
  for (int r = 0; r < process.world_size; ++r)
    if (static_cast<int>(place[r].item<double>()) == process.rank && out.writer) out.ranks.push_back(r);
  return out;
}

NamedTensors share_with_writers(Engine& engine, int rank, const NamedTensors& full, const std::vector<int>& writers) {
  const bool writer = std::count(writers.begin(), writers.end(), rank) > 0;
  json header = json::array();
  if (rank == 0)
    for (auto& [name, t] : full)
      header.push_back({name, static_cast<int>(t.scalar_type()), t.sizes().vec()});
  header = json::parse(engine.broadcast(header.dump(), 0));
  NamedTensors out;
  for (size_t k = 0; k < header.size(); ++k) {
    const auto dtype = static_cast<c10::ScalarType>(header[k][1].get<int>());
    torch::Tensor t = rank == 0 ? full[k].second.contiguous()
                                : torch::empty(header[k][2].get<std::vector<int64_t>>(), torch::TensorOptions().dtype(dtype));
    engine.broadcast_(t, 0);
    if (writer) out.emplace_back(header[k][0].get<std::string>(), std::move(t));
  }
  return out;
}

std::vector<std::string> verify_on_each_machine(Engine& engine, const ProcessInfo& process,
                                                const std::vector<std::pair<std::string, std::string>>& candidates,
                                                const std::function<fs::path(const std::string&)>& local) {
  std::vector<std::string> why(candidates.size());
  for (size_t c = 0; c < candidates.size(); ++c) why[c] = candidates[c].second;
  for (auto [machine, first] : machine_writers(engine, process)) {
    if (first == 0) continue;  // rank 0 checked them
    json mine = json::array();
    if (process.rank == first)
      for (auto& [path, rank0_why] : candidates) {
        const std::string v = verify_checkpoint(local(path));
        mine.push_back(v.empty() ? "" : "on machine " + std::to_string(machine) + ": " + v);
      }
    mine = json::parse(engine.broadcast(mine.dump(), first));
    for (size_t c = 0; c < candidates.size() && c < mine.size(); ++c)
      if (why[c].empty()) why[c] = mine[c].get<std::string>();
  }
  return why;
}

}  // namespace hasten::detail
