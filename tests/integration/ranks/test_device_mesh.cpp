// The device mesh (config key parallelism_config) and collectives over its process groups, in
// forked ranks, through the public API (mesh_checks.hpp: members and every collective of each
// group), on the shm and gloo backends (mpi: test_mpi.cpp under mpirun). A comm plugin built against the header before groups (1.10) still
// trains ddp and is refused, in one line, only for a mesh that needs groups; bad
// parallelism_config values are one line each.
#include <hasten/hasten.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mesh_checks.hpp"
#include "test_util.hpp"

using hasten::Accelerator;
using hasten::ReduceOp;
using hasten::test::require;
using hasten::test::check_mesh;
using hasten::test::mesh_options;
using hasten::test::with_ranks;

TEST(DeviceMesh, ReplicateByShardOnShm) {
  hasten::launch([] { check_mesh(2, 2, 1); }, with_ranks(4, {{"HASTEN_COMM", "shm"}}));
}

TEST(DeviceMesh, ShardByTensorParallelOnGloo) {
  hasten::launch([] { check_mesh(1, 2, 2); }, with_ranks(4, {{"HASTEN_COMM", "gloo"}}));
}

TEST(DeviceMesh, ThreeDimensionsOnGloo) {
  hasten::launch([] { check_mesh(2, 2, 2); }, with_ranks(8, {{"HASTEN_COMM", "gloo"}}, 300));
}

TEST(DeviceMesh, TensorParallelOverEveryRankOnShm) {
  // tp over the world: its group is the world's communicator, the others single ranks.
  hasten::launch([] { check_mesh(1, 1, 3); }, with_ranks(3, {{"HASTEN_COMM", "shm"}}));
}

TEST(DeviceMesh, DefaultIsReplicateOverEveryRank) {
  hasten::launch(
      [] {
        Accelerator acc;
        auto mesh = acc.device_mesh();
        require(mesh.size("dp_replicate") == 2 && mesh.size("dp_shard") == 1 && mesh.size("tp") == 1 &&
                    mesh.size("dp") == 2,
                "the default mesh is not dp_replicate over every process");
        auto t = torch::tensor({1.0});
        mesh.group("dp").all_reduce_(t);
        require(t.item<double>() == 2.0, "dp all_reduce_ over the default mesh");
      },
      with_ranks(2, {{"HASTEN_COMM", "shm"}}));
}

TEST(DeviceMesh, OneProcess) {
  hasten::test::isolate_home();
  Accelerator acc;
  auto mesh = acc.device_mesh();
  auto g = mesh.group("tp");
  EXPECT_EQ(g.size(), 1);
  EXPECT_EQ(g.ranks(), std::vector<int>{0});
  auto out = g.all_gather(torch::tensor(3.0));
  EXPECT_TRUE(torch::equal(out, torch::tensor({3.0})));
  EXPECT_THROW(mesh.group("pp"), hasten::UsageError);
}

TEST(DeviceMesh, BadConfigIsOneLine) {
  hasten::test::isolate_home();
  auto message = [](const hasten::Options& o) {
    try {
      Accelerator acc(o);
      return std::string("no error");
    } catch (const hasten::Error& e) {
      return std::string(e.what());
    }
  };
  // 2 x 2 on one process.
  EXPECT_NE(message(mesh_options(2, 2, 1)).find("= 4 processes, but the run has 1"), std::string::npos);
  hasten::Options cp;
  cp.parallelism_config = hasten::ParallelismConfig{1, 1, 1, 2};
  EXPECT_NE(message(cp).find("needs context parallelism"), std::string::npos);
  hasten::Options unknown;
  unknown.set = {{"parallelism_config.parallelism_config_pp_size", "2"}};
  EXPECT_NE(message(unknown).find("unknown field 'parallelism_config_pp_size'"), std::string::npos);
  hasten::Options bad;
  bad.set = {{"parallelism_config.parallelism_config_tp_size", "two"}};
  EXPECT_NE(message(bad).find("parallelism_config_tp_size must be a whole number"), std::string::npos);
  hasten::Options zero;
  zero.set = {{"parallelism_config.parallelism_config_dp_shard_size", "0"}};
  EXPECT_NE(message(zero).find("got '0'"), std::string::npos);
  // Accelerate's spelling in --set: tp 1 x dp_shard 1 on one process is fine, and so is the
  // context-parallel strategy Accelerate writes beside the sizes; sequence parallelism is not.
  hasten::Options fine;
  fine.set = {{"parallelism_config.parallelism_config_tp_size", "1"},
              {"parallelism_config.parallelism_config_cp_comm_strategy", "allgather"}};
  EXPECT_EQ(message(fine), "no error");
  hasten::Options strategy;
  strategy.set = {{"parallelism_config.parallelism_config_cp_comm_strategy", "ring"}};
  EXPECT_NE(message(strategy).find("must be allgather or alltoall, got 'ring'"), std::string::npos);
  hasten::Options sp;
  sp.set = {{"parallelism_config.parallelism_config_sp_size", "2"}};
  EXPECT_NE(message(sp).find("needs sequence parallelism"), std::string::npos);
}

// The C example's shm backend built against the 1.10 header (no split): ddp trains over it,
// and only a mesh that needs groups is refused, on every rank, naming the plugin.
TEST(DeviceMesh, PluginWithoutGroups) {
  const std::string plugin = hasten::test::test_plugin("pre_groups", "libhasten-comm-c_shm.so");
  hasten::launch(
      [] {
        hasten::Options o;
        o.strategy = "ddp";
        Accelerator acc(o);
        torch::manual_seed(0);
        auto net = torch::nn::Linear(3, 1);
        torch::optim::SGD sgd(net->parameters(), 0.1);
        auto [model, opt] = acc.prepare(net, sgd);
        const int r = acc.process_index();
        auto x = torch::full({2, 3}, double(r + 1), torch::kFloat);
        auto loss = model(x).sum();
        acc.backward(loss);
        // ddp's gradient is the ranks' mean: (1 + 2) / 2 x 2 rows = 3 per weight.
        require(torch::allclose(net->weight.grad(), torch::full({1, 3}, 3.0f)), "ddp gradient over the 1.10 backend");
        opt.step();
      },
      with_ranks(2, {{"HASTEN_COMM", plugin}}));
  // Every rank gets the refusal, before any rank connects a group.
  hasten::launch(
      [] {
        try {
          Accelerator acc(mesh_options(1, 2, 2));
          require(false, "a 2 x 2 mesh on a backend without groups was accepted");
        } catch (const hasten::PluginError& e) {
          const std::string what = e.what();
          require(what.find("has no process groups") != std::string::npos &&
                      what.find("dp_shard 2 x tp 2") != std::string::npos && what.find("c_shm") != std::string::npos,
                  what);
        }
      },
      with_ranks(4, {{"HASTEN_COMM", plugin}}));
}

// A group does not keep its Accelerator alive (a prepared model's layers hold groups, and the
// Accelerator holds the model): used after the Accelerator is gone, it says so.
TEST(DeviceMesh, GroupOutlivingItsAccelerator) {
  hasten::test::isolate_home();
  std::optional<hasten::ProcessGroup> group;
  {
    Accelerator acc;
    group.emplace(acc.device_mesh().group("tp"));
  }
  auto t = torch::ones({1});
  try {
    group->all_reduce_(t);
    FAIL() << "a group outliving its Accelerator ran a collective";
  } catch (const hasten::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the Accelerator that made it is gone"), std::string::npos) << e.what();
  }
}
