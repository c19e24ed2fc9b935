// Where a process stands in the run, from the environment of each launcher: mpirun's and
// srun's jobs get their store's port from the job id when no MASTER_PORT is set.
#include <hasten/error.hpp>
#include <hasten/process.hpp>

#include <gtest/gtest.h>

namespace {

hasten::Environment mpirun(int rank, int size, int local_size, const std::string& jobid) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", std::to_string(size)},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank % local_size)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(local_size)},
          {"OMPI_MCA_ess_base_jobid", jobid}};
}

TEST(ProcessInfo, MpirunPortComesFromTheJobId) {
  const hasten::ProcessInfo p = hasten::detect_process_info(mpirun(1, 2, 2, "1336737793"));
  EXPECT_EQ(p.launcher, "openmpi");
  EXPECT_EQ(p.rank, 1);
  EXPECT_EQ(p.world_size, 2);
  EXPECT_EQ(p.master_addr, "127.0.0.1");
  EXPECT_EQ(p.master_port, 15000 + 7793);
  EXPECT_NE(p.master_port_source.find("1336737793"), std::string::npos) << p.master_port_source;
  // Short ids use the digits they have; MASTER_PORT wins.
  EXPECT_EQ(hasten::detect_process_info(mpirun(0, 2, 2, "42")).master_port, 15042);
  auto env = mpirun(0, 2, 2, "1336737793");
  env["MASTER_PORT"] = "29511";
  const hasten::ProcessInfo given = hasten::detect_process_info(env);
  EXPECT_EQ(given.master_port, 29511);
  EXPECT_TRUE(given.master_port_source.empty());
}

TEST(ProcessInfo, MpirunAcrossMachinesNeedsMasterAddr) {
  try {
    hasten::detect_process_info(mpirun(2, 4, 2, "77"));
    FAIL() << "an mpirun run over 2 machines without MASTER_ADDR was accepted";
  } catch (const hasten::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR"), std::string::npos) << e.what();
  }
  auto env = mpirun(2, 4, 2, "77");
  env["MASTER_ADDR"] = "10.0.0.1";
  const hasten::ProcessInfo p = hasten::detect_process_info(env);
  EXPECT_EQ(p.num_nodes, 2);
  EXPECT_EQ(p.node_rank, 1);
  EXPECT_EQ(p.master_addr, "10.0.0.1");
}

TEST(ProcessInfo, SrunPortComesFromTheJobId) {
  const hasten::ProcessInfo p = hasten::detect_process_info({{"SLURM_PROCID", "0"},
                                                             {"SLURM_NTASKS", "2"},
                                                             {"SLURM_STEP_ID", "0"},
                                                             {"SLURM_LOCALID", "0"},
                                                             {"SLURM_NNODES", "1"},
                                                             {"SLURM_JOB_ID", "981234"}});
  EXPECT_EQ(p.launcher, "slurm");
  EXPECT_EQ(p.master_port, 15000 + 1234);
  EXPECT_NE(p.master_port_source.find("SLURM_JOB_ID"), std::string::npos);
}

}  // namespace
