// save_on_each_node: which rank writes each machine's copy of a checkpoint, the model's full
// tensors passed to those ranks, each machine's view of the checkpoints load_state finds, and
// the refusal of a copy where its ranks do not run.
#include "checkpoint/checkpoint_machines.hpp"

#include <hasten/error.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <random>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/checkpoint_load.hpp"

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

bool saving_on_each_machine(Engine& engine, const ProcessInfo& process, bool configured, const char* what) {
  if (process.num_nodes <= 1) return false;
  torch::Tensor flag = torch::full({2}, configured ? 1.0 : 0.0, torch::kDouble);
  flag[1] = -flag[1];  // [max, -min] in one reduction
  flag = engine.reduce(flag, "max");
  const bool any = flag[0].item<double>() > 0, all = -flag[1].item<double>() > 0;
  if (any != all)
    throw UsageError(std::string(what) + ": save_on_each_node is true on some machines and false on others; give "
                     "every machine the same value");
  return all;
}

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
  out.save = token;
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
    torch::Tensor t = rank == 0 ? full[k].second.to(torch::kCPU).contiguous()  // the CPU backend carries it
                                : torch::empty(header[k][2].get<std::vector<int64_t>>(), torch::TensorOptions().dtype(dtype));
    engine.broadcast_(t, 0);
    if (writer) out.emplace_back(header[k][0].get<std::string>(), std::move(t));
  }
  return out;
}

std::vector<std::string> verify_on_each_machine(Engine& engine, const ProcessInfo& process,
                                                const std::vector<std::pair<std::string, std::string>>& candidates,
                                                const std::function<fs::path(const std::string&)>& local) {
  auto save_of = [](const fs::path& dir) {
    try {
      return read_manifest(dir).value("save", std::string());
    } catch (const std::exception&) {
      return std::string();
    }
  };
  // Rank 0's copies' save tokens: every machine's copy of a candidate must carry the same.
  json tokens = json::array();
  if (process.rank == 0)
    for (auto& [path, why] : candidates) tokens.push_back(why.empty() ? save_of(path) : std::string());
  tokens = json::parse(engine.broadcast(tokens.dump(), 0));
  std::vector<std::string> why(candidates.size());
  for (size_t c = 0; c < candidates.size(); ++c) why[c] = candidates[c].second;
  for (auto [machine, first] : machine_writers(engine, process)) {
    if (first == 0) continue;  // rank 0 checked them
    json mine = json::array();
    if (process.rank == first)
      for (size_t c = 0; c < candidates.size(); ++c) {
        const fs::path dir = local(candidates[c].first);
        recover_checkpoint(dir);  // a copy a killed save left set aside
        std::string v = verify_checkpoint(dir);
        if (v.empty() && c < tokens.size() && save_of(dir) != tokens[c].get<std::string>())
          v = "'" + dir.string() + "' is a copy of another save than machine 0's (their manifests' save tokens "
              "differ: one machine's save did not finish, or the directory holds an older run's)";
        mine.push_back(v.empty() ? "" : "on machine " + std::to_string(machine) + ": " + v);
      }
    mine = json::parse(engine.broadcast(mine.dump(), first));
    for (size_t c = 0; c < candidates.size() && c < mine.size(); ++c)
      if (why[c].empty()) why[c] = mine[c].get<std::string>();
  }
  return why;
}

// A copy that save_on_each_node left on one machine holds its own ranks' files only: it
// loads on the same number of processes, each on the machine that holds its files (the
// rest of a resharding load reads every saved rank's files).
void Engine::Impl::CheckpointLoad::check_machine_copy() const {
  if (!manifest_.contains("ranks")) return;
  const json& ranks = manifest_["ranks"];
  const bool mine = std::find(ranks.begin(), ranks.end(), json(rank_)) != ranks.end();
  const std::string saved_strategy = state_.value("strategy", "");
  if (saved_world_ == world_ && mine && saved_strategy == s_.strategy->name()) return;
  const std::string held = (ranks.size() == 1 ? "rank " : "ranks ") + ranks.dump();
  throw Error("load_state: '" + dir_.string() + "' is one machine's copy of a checkpoint saved on each node (it holds "
              "the files of " + held + " of " + std::to_string(saved_world_) + "); it loads on " +
              std::to_string(saved_world_) + " processes under " + saved_strategy + " with the same ranks on each machine" +
              (saved_world_ != world_                      ? ", not " + std::to_string(world_)
               : saved_strategy != s_.strategy->name() ? ", not under " + s_.strategy->name()
                                                        : ", and this machine runs rank " + std::to_string(rank_)) +
              " (to resume on another layout, save with save_on_each_node false on a shared file system)");
}

}  // namespace hasten::detail
