// Where each rank sits in the run's device mesh (config key parallelism_config), and which ranks
// form its group along a dimension: arithmetic only, no communicator (process_groups.hpp makes
// the groups' communicators from it).
//
// The dimensions, outermost first: dp_replicate, dp_shard, cp, tp, as Accelerate's
// ParallelismConfig and torchtitan lay them out: tp innermost, so a tensor-parallel group is
// adjacent ranks (one machine's, where the fast links are), and dp_replicate outermost, so its
// groups cross machines. A rank's coordinates are the digits of its number in that mixed radix.
#pragma once

#include <hasten/config.hpp>

#include <string>
#include <vector>

namespace hasten::detail {

// One group of the mesh as one rank sees it.
struct GroupMembers {
  std::string name;        // "dp_replicate", "dp_shard", "cp", "tp" or "dp"
  std::vector<int> ranks;  // its members' world ranks, ascending (the group's rank order)
  int rank = 0;            // this rank's place in `ranks`
  int color = 0;           // which group of this dimension it is: 0..(world / size - 1)
  int size() const { return static_cast<int>(ranks.size()); }
};

class MeshLayout {
 public:
  // Throws ConfigError (one line) when the sizes' product is not world_size. All sizes 1 with
  // several processes is Accelerate's default: dp_replicate over every process.
  MeshLayout(const ParallelismConfig& sizes, int world_size);

  // The four dimensions with their sizes, outermost first (sizes of 1 included).
  const std::vector<std::pair<std::string, int>>& dims() const { return dims_; }
  // The group names: the four dimensions and "dp" (dp_replicate x dp_shard, the ranks that see
  // different data).
  static const std::vector<std::string>& group_names();
  // The size of a dimension or group; throws UsageError naming the allowed ones otherwise.
  int size(const std::string& name) const;
  // world_rank's group along `name`.
  GroupMembers group(const std::string& name, int world_rank) const;
  // "dp_replicate 2 x dp_shard 2" (the dimensions above 1; "dp_replicate 1" for one process).
  std::string describe() const;

 private:
  std::vector<int> along(const std::string& name) const;  // the dimensions a group spans
  std::vector<std::pair<std::string, int>> dims_;
  int world_ = 1;
};

}  // namespace hasten::detail
