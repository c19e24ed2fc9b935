// save_on_each_node (Accelerate's ProjectConfiguration.save_on_each_node): on machines that
// share no file system, each machine keeps a whole checkpoint of its own: its first process
// writes what rank 0 writes (the model, the run's state, registered objects), every process
// its own per-rank files beside them, and each machine resumes from its own copy.
#pragma once

#include <hasten/detail/engine.hpp>
#include <hasten/process.hpp>
#include <hasten/safetensors.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace hasten::detail {

// Who writes which copy of one save.
struct MachineCopies {
  std::vector<int> writers;  // the ranks that write a copy (each machine's lowest rank), ascending
  bool writer = false;       // this rank writes one
  std::vector<int> ranks;    // on a writer: the ranks whose files its copy holds, ascending
  std::string save;          // the save's random token, in every copy's manifest ("save")
};

// Collective where the run spans machines: whether save_state/load_state (`what`) keep a copy
// on each machine (save_on_each_node, and more than one machine). Every rank must agree, or
// the two paths' collectives would not meet: a difference is a UsageError on every rank.
bool saving_on_each_machine(Engine& engine, const ProcessInfo& process, bool configured, const char* what);

// Collective. Each machine's lowest rank, machine by machine, prepares the save of `target`
// on its own disk (prepare_save; `target` is this machine's path: automatic names resolve
// under each machine's own project_dir). A machine whose temporary directory turns out to be
// one an earlier machine made for this save (their file systems are shared) writes no copy
// of its own: its ranks' files go into that machine's. `refuse_existing` (automatic naming):
// a target that exists is an error. Throws Error on every rank, naming the machine, when one
// cannot prepare; the others then remove what they made.
MachineCopies prepare_machine_copies(Engine& engine, const ProcessInfo& process, const std::filesystem::path& target,
                                     bool refuse_existing);

// Collective: rank 0's full tensors (`full`, what state_dict(model, 0) gave it) on every
// writer; other ranks get an empty list. One tensor at a time: a rank that writes no copy
// holds one tensor beyond its own state while it passes.
NamedTensors share_with_writers(Engine& engine, int rank, const NamedTensors& full, const std::vector<int>& writers);

// Collective, for load_state: each machine's view of the candidate checkpoints rank 0 found
// (`candidates`: [path, why-not] pairs, why-not "" when loadable). Each machine's lowest
// rank puts back a copy a killed save left set aside, then checks its own copy of each
// (`local(path)` names it there) and that it is a copy of the same save as rank 0's (the
// manifests' "save" tokens); the result says for each candidate why it cannot be loaded on
// some machine ("" when it can everywhere).
std::vector<std::string> verify_on_each_machine(Engine& engine, const ProcessInfo& process,
                                                const std::vector<std::pair<std::string, std::string>>& candidates,
                                                const std::function<std::filesystem::path(const std::string&)>& local);

}  // namespace hasten::detail
