// The device mesh's groups checked from inside a rank (test_device_mesh.cpp under hasten's
// launcher, test_mpi.cpp under mpirun): which ranks each group holds, against the mixed-radix
// layout written out here by hand, and every collective over each group against the members'
// contributions, interleaved with world collectives.
#pragma once

#include <hasten/hasten.hpp>

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace hasten::test {

inline hasten::Options mesh_options(int dp_replicate, int dp_shard, int tp) {
  hasten::Options o;
  o.parallelism_config = hasten::ParallelismConfig{dp_replicate, dp_shard, tp, 1};
  return o;
}

inline std::string text(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The members of rank r's group along the dimensions `spans` (a subset of {0: dp_replicate,
// 1: dp_shard, 2: cp, 3: tp}), written out independently of the library: every rank whose
// coordinates outside `spans` equal r's.
inline std::vector<int> expected_members(const std::vector<int>& sizes, int world, int r, const std::vector<int>& spans) {
  auto coords = [&](int q) {
    std::vector<int> c(4);
    for (int d = 3, div = 1; d >= 0; --d) {
      c[static_cast<size_t>(d)] = (q / div) % sizes[static_cast<size_t>(d)];
      div *= sizes[static_cast<size_t>(d)];
    }
    return c;
  };
  std::vector<int> out;
  const auto mine = coords(r);
  for (int q = 0; q < world; ++q) {
    const auto theirs = coords(q);
    bool same = true;
    for (int d = 0; d < 4; ++d) {
      bool spanned = false;
      for (int s : spans) spanned = spanned || s == d;
      if (!spanned && theirs[static_cast<size_t>(d)] != mine[static_cast<size_t>(d)]) same = false;
    }
    if (same) out.push_back(q);
  }
  return out;
}

// Every group of the mesh dp_replicate x dp_shard x tp on this rank: members, then each
// collective, checked against what the members contributed.
inline void check_mesh(int dp_replicate, int dp_shard, int tp) {
  hasten::Accelerator acc(mesh_options(dp_replicate, dp_shard, tp));
  const int r = acc.process_index(), w = acc.num_processes();
  const std::vector<int> sizes = {dp_replicate, dp_shard, 1, tp};
  auto mesh = acc.device_mesh();
  const auto dims = mesh.dims();
  require(dims.size() == 4 && dims[0].first == "dp_replicate" && dims[0].second == dp_replicate &&
              dims[1].first == "dp_shard" && dims[1].second == dp_shard && dims[2].first == "cp" && dims[3].first == "tp" &&
              dims[3].second == tp,
          "dims() is not dp_replicate, dp_shard, cp, tp with the configured sizes");
  const std::map<std::string, std::vector<int>> spans = {
      {"dp_replicate", {0}}, {"dp_shard", {1}}, {"cp", {2}}, {"tp", {3}}, {"dp", {0, 1}}};
  for (int round = 0; round < 2; ++round) {  // twice: the groups' communicators are reused
    for (const auto& [name, along] : spans) {
      auto g = mesh.group(name);
      const auto want = expected_members(sizes, w, r, along);
      require(g.ranks() == want, "rank " + std::to_string(r) + ": group " + name + " is " + text(g.ranks()) + ", want " +
                                     text(want));
      require(g.size() == static_cast<int>(want.size()) && want[static_cast<size_t>(g.rank())] == r,
              "group " + name + ": size or rank wrong");
      require(mesh.size(name) == g.size() && mesh.coordinate(name) == g.rank(), "mesh.size/coordinate of " + name);
      // all_reduce_: sum and max of (rank + 1), avg of 2 x rank.
      auto t = torch::tensor({double(r + 1), double(r + 1), double(2 * r)});
      g.all_reduce_(t);
      double sum = 0, avg = 0;
      for (int q : want) sum += q + 1, avg += 2.0 * q / static_cast<double>(want.size());
      require(t[0].item<double>() == sum, "group " + name + ": all_reduce_ sum " + std::to_string(t[0].item<double>()) +
                                              ", want " + std::to_string(sum));
      auto m = torch::tensor({int64_t(r + 1)});
      g.all_reduce_(m, hasten::ReduceOp::Max);
      require(m.item<int64_t>() == want.back() + 1, "group " + name + ": all_reduce_ max");
      auto a = torch::tensor({2.0 * r});
      g.all_reduce_(a, hasten::ReduceOp::Avg);
      require(std::abs(a.item<double>() - avg) < 1e-12, "group " + name + ": all_reduce_ avg");
      // A world collective between group ones: the group communicators are apart from the world's.
      auto world_sum = acc.reduce(torch::tensor({double(r)}), "sum");
      require(world_sum.item<double>() == w * (w - 1) / 2.0, "world reduce between group collectives");
      // all_gather: [rank, 10 x rank] from each member, in group order.
      auto gathered = g.all_gather(torch::tensor({int64_t(r), int64_t(10 * r)}));
      std::vector<int64_t> want_gather;
      for (int q : want) want_gather.push_back(q), want_gather.push_back(10 * q);
      require(torch::equal(gathered, torch::tensor(want_gather)), "group " + name + ": all_gather");
      // broadcast_ from the group's last member.
      auto b = torch::full({5}, static_cast<float>(r));
      g.broadcast_(b, g.size() - 1);
      require(torch::equal(b, torch::full({5}, static_cast<float>(want.back()))), "group " + name + ": broadcast_");
      // reduce_scatter: member q contributes (q + 1) x [0, 1, ..., 2 x size - 1]; this member
      // keeps its two elements of the sum.
      const int64_t n = g.size();
      auto in = torch::arange(2 * n, torch::kDouble) * double(r + 1);
      auto part = g.reduce_scatter(in);
      auto full = torch::arange(2 * n, torch::kDouble) * sum;
      require(torch::equal(part, full.slice(0, 2 * g.rank(), 2 * g.rank() + 2)), "group " + name + ": reduce_scatter");
    }
  }
  // A broadcast root outside the group is one clear error on every rank.
  auto tp_group = mesh.group("tp");
  auto t = torch::zeros({1});
  try {
    tp_group.broadcast_(t, tp_group.size());
    require(false, "broadcast_ from a rank outside the group did not throw");
  } catch (const hasten::UsageError& e) {
    require(std::string(e.what()).find("not a rank of the group") != std::string::npos, e.what());
  }
}

}  // namespace hasten::test
