// One GPU per process: select_cuda_device from gpu_ids and the local rank, and gpu_ids in the
// config. Pure functions of their arguments, so they run without a GPU.
#include <hasten/config.hpp>
#include <hasten/error.hpp>
#include <hasten/process.hpp>

#include <gtest/gtest.h>

#include <string>

#include "test_util.hpp"

namespace {

std::string refusal(const std::string& gpu_ids, int local_rank, int local_world, int visible) {
  try {
    hasten::select_cuda_device(gpu_ids, local_rank, local_world, visible);
  } catch (const hasten::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceSelection, AllGivesEachLocalRankItsOwnVisibleGpu) {
  for (int r = 0; r < 4; ++r) EXPECT_EQ(hasten::select_cuda_device("all", r, 4, 4), r);
  EXPECT_EQ(hasten::select_cuda_device("all", 1, 2, 8), 1);  // fewer processes than GPUs
}

TEST(DeviceSelection, AListGivesTheListedOrdinalsInLocalRankOrder) {
  EXPECT_EQ(hasten::select_cuda_device("2,0", 0, 2, 4), 2);
  EXPECT_EQ(hasten::select_cuda_device("2,0", 1, 2, 4), 0);
  EXPECT_EQ(hasten::select_cuda_device(" 3 , 1", 1, 2, 4), 1);
}

TEST(DeviceSelection, TwoRanksOnOneGpuAreRefusedBeforeAnyCommunicator) {
  const auto all = refusal("all", 2, 3, 2);
  EXPECT_NE(all.find("this machine runs 3 processes but has 2 visible GPUs"), std::string::npos) << all;
  EXPECT_NE(all.find("two ranks would share a GPU"), std::string::npos) << all;
  // Rank 0 is refused too, not only the rank past the end: every rank stops with the same line.
  EXPECT_EQ(refusal("all", 0, 3, 2), all);
  const auto listed = refusal("0", 0, 2, 8);
  EXPECT_NE(listed.find("has 1 GPU in gpu_ids '0'"), std::string::npos) << listed;
}

// srun --gpus-per-task=1 (or any launcher that sets CUDA_VISIBLE_DEVICES per process): each
// process sees only its own GPU, whatever its local rank.
TEST(DeviceSelection, AGpuBoundPerProcessIsTaken) {
  EXPECT_TRUE(hasten::gpu_bound_per_process({{"CUDA_VISIBLE_DEVICES", "3"}}, 4));
  EXPECT_FALSE(hasten::gpu_bound_per_process({{"CUDA_VISIBLE_DEVICES", "3"}}, 1));  // one process: nothing to bind
  EXPECT_FALSE(hasten::gpu_bound_per_process({{"CUDA_VISIBLE_DEVICES", "0,1"}}, 2));
  EXPECT_FALSE(hasten::gpu_bound_per_process({{"CUDA_VISIBLE_DEVICES", ""}}, 2));
  EXPECT_FALSE(hasten::gpu_bound_per_process({}, 2));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(hasten::select_cuda_device("all", r, 4, 1, true), 0);
  // Without the binding the same numbers are two ranks on one GPU.
  EXPECT_NE(refusal("all", 3, 4, 1).find("two ranks would share a GPU"), std::string::npos);
  // A gpu_ids list still counts among the visible ones.
  EXPECT_NE(refusal("1", 0, 4, 1).find("two ranks would share a GPU"), std::string::npos);
}

TEST(DeviceSelection, ANotVisibleGpuIsRefused) {
  const auto e = refusal("0,5", 1, 2, 4);
  EXPECT_NE(e.find("GPU 5 is not visible (4 visible GPUs, ordinals 0..3"), std::string::npos) << e;
}

TEST(DeviceSelection, MalformedListsAreRefusedWithWhatIsAllowed) {
  for (const std::string bad : {"", "0,,1", "a", "-1", "0,0", "1.5", "all,0", "0;1"}) {
    const auto e = refusal(bad, 0, 1, 4);
    EXPECT_NE(e.find("gpu_ids: '" + bad + "'"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("allowed: all, or a comma list of GPU ordinals"), std::string::npos) << e;
  }
  EXPECT_NE(refusal("0,0", 0, 1, 4).find("names GPU 0 twice"), std::string::npos);
}

TEST(DeviceSelection, TheConfigKeyIsReadAndCheckedWhereverTheRunGoes) {
  hasten::test::isolate_home();
  hasten::Options o;
  o.set = {{"gpu_ids", "1,3"}};
  EXPECT_EQ(hasten::resolve_config(o, {}).gpu_ids, "1,3");
  EXPECT_EQ(hasten::resolve_config({}, {}).gpu_ids, "all");
  EXPECT_EQ(hasten::resolve_config({}, {{"HASTEN_GPU_IDS", "0"}}).gpu_ids, "0");
  o.set = {{"gpu_ids", "0,x"}};
  try {
    hasten::resolve_config(o, {});
    FAIL() << "a malformed gpu_ids must be a config error, even on a CPU run";
  } catch (const hasten::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("config error: gpu_ids: '0,x' is not a list of GPU ordinals"), std::string::npos) << what;
    EXPECT_NE(what.find("(code"), std::string::npos) << "where it came from: " << what;
  }
}

}  // namespace
