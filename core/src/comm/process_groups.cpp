#include "comm/process_groups.hpp"

#include <hasten/error.hpp>

#include "util/text_util.hpp"

namespace hasten::detail {

ProcessGroups::ProcessGroups(MeshLayout layout, int world_rank, Communicator& world, int ranks_per_machine)
    : layout_(std::move(layout)) {
  const int world_size = world.world_size();
  // Refused before any split: no rank connects a group that another rank will never join.
  std::vector<std::string> split_groups;
  for (const auto& name : MeshLayout::group_names()) {
    const int n = layout_.size(name);
    if (n > 1 && n < world_size) split_groups.push_back(name);
  }
  if (!split_groups.empty())
    if (const std::string which = world.cannot_split(); !which.empty())
      throw PluginError(which + ": has no process groups (comm slot split, ABI 1.11), which the device mesh " +
                        layout_.describe() + " (parallelism_config) needs for its " + join(split_groups, ", ") +
                        " groups; use a comm backend with groups (shm, gloo, nccl) or a mesh of one dimension");
  // Groups equal to one made before share its communicator ("dp" is dp_shard when dp_replicate
  // is 1): one connection per distinct set of ranks.
  std::map<std::vector<int>, Communicator*> made;
  for (const auto& name : MeshLayout::group_names()) {
    Entry e;
    e.group = layout_.group(name, world_rank);
    const int n = e.group.size();
    if (n == world_size) {
      e.comm = &world;
    } else if (auto it = made.find(e.group.ranks); it != made.end()) {
      e.comm = it->second;
    } else {
      const int per = ranks_per_machine > 0 ? ranks_per_machine : 1;
      const bool across = e.group.ranks.front() / per != e.group.ranks.back() / per;
      owned_.push_back(n == 1 ? make_local_communicator()
                              : world.split(e.group.color, e.group.rank, n,
                                            "hasten/group/" + name + "/" + std::to_string(e.group.color) + "/", across));
      e.comm = owned_.back().get();
      made.emplace(e.group.ranks, e.comm);
    }
    entries_.emplace(name, std::move(e));
  }
}

const ProcessGroups::Entry& ProcessGroups::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    throw UsageError("device mesh: no group '" + name + "' (allowed: " + join(MeshLayout::group_names(), ", ") + ")");
  return it->second;
}

}  // namespace hasten::detail
