#include "comm/mesh_layout.hpp"

#include <hasten/error.hpp>

#include "util/text_util.hpp"

namespace hasten::detail {

MeshLayout::MeshLayout(const ParallelismConfig& p, int world_size) : world_(world_size) {
  const bool unset = p.dp_replicate_size == 1 && p.dp_shard_size == 1 && p.tp_size == 1 && p.cp_size == 1;
  dims_ = {{"dp_replicate", unset ? world_size : p.dp_replicate_size}, {"dp_shard", p.dp_shard_size}, {"cp", p.cp_size}, {"tp", p.tp_size}};
  long long product = 1;
  for (const auto& d : dims_) product *= d.second;
  if (product != world_size)
    throw ConfigError("config error: parallelism_config: dp_replicate_size " + std::to_string(p.dp_replicate_size) +
                      " x dp_shard_size " + std::to_string(p.dp_shard_size) + " x cp_size " + std::to_string(p.cp_size) +
                      " x tp_size " + std::to_string(p.tp_size) + " = " + std::to_string(product) + " processes, but the run has " +
                      std::to_string(world_size) + " (the product must be the number of processes)");
}

const std::vector<std::string>& MeshLayout::group_names() {
  static const std::vector<std::string> names = {"dp_replicate", "dp_shard", "cp", "tp", "dp"};
  return names;
}

std::vector<int> MeshLayout::along(const std::string& name) const {
  if (name == "dp") return {0, 1};
  for (int d = 0; d < static_cast<int>(dims_.size()); ++d)
    if (dims_[static_cast<size_t>(d)].first == name) return {d};
  throw UsageError("device mesh: no dimension '" + name + "' (allowed: " + join(group_names(), ", ") + ")");
}

int MeshLayout::size(const std::string& name) const {
  int n = 1;
  for (int d : along(name)) n *= dims_[static_cast<size_t>(d)].second;
  return n;
}

GroupMembers MeshLayout::group(const std::string& name, int world_rank) const {
  const std::vector<int> mine = along(name);
  const size_t n = dims_.size();
  // Coordinates: the digits of the rank, tp (the last dimension) the fastest.
  std::vector<int> coord(n), stride(n);
  int s = 1;
  for (size_t d = n; d-- > 0;) {
    stride[d] = s;
    coord[d] = (world_rank / s) % dims_[d].second;
    s *= dims_[d].second;
  }
  auto spans = [&](size_t d) {
    for (int m : mine)
      if (static_cast<size_t>(m) == d) return true;
    return false;
  };
  GroupMembers g;
  g.name = name;
  // The first member: this rank with its coordinates along the group's dimensions at 0; the
  // others vary those coordinates, outermost slowest, so `ranks` ascends.
  int base = world_rank;
  for (size_t d = 0; d < n; ++d)
    if (spans(d)) base -= coord[d] * stride[d];
  std::vector<int> members = {base};
  for (size_t d = 0; d < n; ++d) {
    if (!spans(d)) continue;
    std::vector<int> next;
    for (int m : members)
      for (int i = 0; i < dims_[d].second; ++i) next.push_back(m + i * stride[d]);
    members = std::move(next);
  }
  g.ranks = std::move(members);
  for (size_t i = 0; i < g.ranks.size(); ++i)
    if (g.ranks[i] == world_rank) g.rank = static_cast<int>(i);
  // Color: the coordinates outside the group, as one number (outermost slowest).
  for (size_t d = 0; d < n; ++d)
    if (!spans(d)) g.color = g.color * dims_[d].second + coord[d];
  return g;
}

std::string MeshLayout::describe() const {
  std::vector<std::string> parts;
  for (const auto& d : dims_)
    if (d.second > 1) parts.push_back(d.first + " " + std::to_string(d.second));
  return parts.empty() ? "dp_replicate 1" : join(parts, " x ");
}

}  // namespace hasten::detail
