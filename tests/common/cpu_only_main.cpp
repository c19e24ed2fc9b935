// main() of the CPU suites: they compare CPU runs with each other and with CPU peers, so on a
// machine with GPUs they must not drift onto CUDA (an Accelerator picks a GPU where it sees
// one). No device is visible to them; the gpu-labelled suites (test_gpu.cpp, test_nccl.cpp)
// use gtest's own main.
#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);  // read by CUDA when it first initialises
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
