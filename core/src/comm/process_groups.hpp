// The run's process groups: a communicator for each group of the device mesh this rank is in
// (mesh_layout.hpp), made from the world's communicator at set-up and destroyed before it.
// What plugins reach through host->group and users through Accelerator::device_mesh().
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mesh_layout.hpp"

namespace hasten::detail {

class ProcessGroups {
 public:
  // One of this rank's groups. Its address is the hasten_group* plugins hold (stable: the map
  // never changes after construction).
  struct Entry {
    GroupMembers group;
    Communicator* comm = nullptr;  // the world's (a group of every rank), or one of owned_
  };

  // Collective: every rank of `world` builds the same groups in the same order. A group of
  // every rank is the world's communicator, one of a single rank a local one, any other a split
  // of the world's. Throws PluginError, one line naming the backend and the mesh, when a group
  // needs a split the backend cannot make. `world` outlives this. ranks_per_machine: the
  // launchers give each machine that many consecutive ranks (machine m: m x n to m x n + n - 1),
  // which says which groups span machines (comm_stats).
  ProcessGroups(MeshLayout layout, int world_rank, Communicator& world, int ranks_per_machine);

  const MeshLayout& layout() const { return layout_; }
  // UsageError naming the groups for an unknown name.
  const Entry& get(const std::string& name) const;
  // Inline: the host API's look-ups (plugins/host_api.cpp) use them without linking this file.
  const Entry* find(const std::string& name) const {
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : &it->second;
  }
  bool holds(const void* entry) const {
    for (const auto& [name, e] : entries_)
      if (&e == entry) return true;
    return false;
  }
  std::string names() const {
    std::string s;
    for (const auto& [name, e] : entries_) s += (s.empty() ? "" : ", ") + name;
    return s;
  }

 private:
  MeshLayout layout_;
  std::map<std::string, Entry> entries_;
  std::vector<std::unique_ptr<Communicator>> owned_;
};

}  // namespace hasten::detail
