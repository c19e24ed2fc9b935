// The mpi comm plugin's collective suite, the one gloo and shm pass (collective_checks.hpp).
// Not a ctest test of its own: MPI gives ranks only to processes mpirun started, so
// tests/integration/test_mpirun.py runs this program under `mpirun -np 2` and `-np 3` with
// HASTEN_COMM=mpi, and its device-mesh check (MPI_Comm_split groups) under `mpirun -np 4`.
#include <gtest/gtest.h>

#include <cstdlib>

#include "collective_checks.hpp"
#include "mesh_checks.hpp"

TEST(Mpi, EveryOperationAndDtypeUnderMpirun) {
  ASSERT_NE(std::getenv("OMPI_COMM_WORLD_SIZE"), nullptr) << "run this program under mpirun (test_mpirun.py does)";
  hasten::test::all_operations_and_dtypes();
}

TEST(Mpi, DeviceMeshUnderMpirun) {
  ASSERT_NE(std::getenv("OMPI_COMM_WORLD_SIZE"), nullptr) << "run this program under mpirun (test_mpirun.py does)";
  ASSERT_STREQ(std::getenv("OMPI_COMM_WORLD_SIZE"), "4") << "the mesh check is dp_replicate 2 x dp_shard 2";
  hasten::test::check_mesh(2, 2, 1);
}
