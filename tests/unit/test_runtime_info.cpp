// Facts about the process: the BLAS in use and the OpenBLAS kernel advice hasten launch acts on.
#include <hasten/runtime_info.hpp>

#include <gtest/gtest.h>

using hasten::openblas_coretype_advice;

namespace {
const std::vector<std::string> kAvx512 = {"sse3", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl",
                                          "avx512dq", "avx512cd"};
}

TEST(BlasAdvice, AnUnrecognisedAvx512CpuGetsSkylakeXKernels) {
  auto a = openblas_coretype_advice("Prescott", kAvx512);
  EXPECT_EQ(a.coretype, "SkylakeX");
  EXPECT_NE(a.reason.find("OpenBLAS picked Prescott kernels"), std::string::npos) << a.reason;
  auto bf16 = kAvx512;
  bf16.push_back("avx512_bf16");
  EXPECT_EQ(openblas_coretype_advice("Nehalem", bf16).coretype, "Cooperlake");
}

TEST(BlasAdvice, OlderFamiliesAreUpgradedToWhatTheFlagsAllow) {
  EXPECT_EQ(openblas_coretype_advice("Core2", {"sse3", "avx", "avx2", "fma"}).coretype, "Haswell");
  EXPECT_EQ(openblas_coretype_advice("Sandybridge", {"avx", "avx2", "fma"}).coretype, "Haswell");
  EXPECT_EQ(openblas_coretype_advice("Prescott", {"sse3", "avx"}).coretype, "Sandybridge");
}

TEST(BlasAdvice, ARecognisedCpuIsLeftAlone) {
  EXPECT_EQ(openblas_coretype_advice("Cooperlake", kAvx512).coretype, "");
  EXPECT_EQ(openblas_coretype_advice("SkylakeX", kAvx512).coretype, "");
  EXPECT_EQ(openblas_coretype_advice("Haswell", {"avx2", "fma"}).coretype, "");
  EXPECT_EQ(openblas_coretype_advice("Zen", {"avx2", "fma"}).coretype, "");
  EXPECT_EQ(openblas_coretype_advice("Prescott", {"sse3"}).coretype, "");  // nothing better to offer
  EXPECT_EQ(openblas_coretype_advice("", kAvx512).coretype, "");           // not OpenBLAS
}

TEST(BlasInfo, NamesTheLibraryInUse) {
  const auto info = hasten::blas_info();
  EXPECT_NE(info.library, "unknown") << "LibTorch's BLAS is not mapped into the process";
  if (info.library == "openblas") {
    EXPECT_FALSE(info.core.empty());
  }
}

TEST(BlasInfo, SetBlasThreadsSizesTheBlasPool) {
  const auto before = hasten::blas_info();
  if (before.library != "openblas" && before.library != "mkl") {
    EXPECT_FALSE(hasten::set_blas_threads(2)) << "only OpenBLAS and MKL have a pool to size";
    GTEST_SKIP() << "the BLAS is " << before.library;
  }
  for (int n : {3, 1}) {
    ASSERT_TRUE(hasten::set_blas_threads(n));
    EXPECT_EQ(hasten::blas_info().threads, n);
  }
  EXPECT_TRUE(hasten::set_blas_threads(0));  // at least one thread
  EXPECT_EQ(hasten::blas_info().threads, 1);
  hasten::set_blas_threads(before.threads);
}

TEST(BlasInfo, TheWheelsMklIsNamedWithItsVersion) {
  const auto info = hasten::blas_info();
  if (info.library != "mkl") GTEST_SKIP() << "the BLAS is " << info.library;
  EXPECT_FALSE(info.config.empty()) << "MKL's version, from LibTorch's build configuration";
  EXPECT_NE(info.summary().find("mkl " + info.config), std::string::npos) << info.summary();
  EXPECT_NE(info.path.find("libtorch_cpu"), std::string::npos) << info.path;
}
