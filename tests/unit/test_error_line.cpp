// What hasten's programs print for an error that ends them: a LibTorch error without its C++
// stack frames, and never an empty line.
#include <gtest/gtest.h>

#include <stdexcept>

#include "../../apps/error_line.hpp"

using hasten::cli::error_line;

TEST(ErrorLine, LibTorchStackFramesAreDropped) {
  // c10::Error::what() as LibTorch 1.13 builds it.
  const std::runtime_error e(
      "Connection closed by peer [127.0.0.1]:4242\n"
      "Exception raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:604 (most recent call first):\n"
      "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f in libc10.so)\n");
  EXPECT_EQ(error_line(e), "Connection closed by peer [127.0.0.1]:4242");
}

TEST(ErrorLine, AnEmptyMessageStillSaysSomething) {
  const std::runtime_error e("");
  const std::string line = error_line(e);
  EXPECT_EQ(line.rfind("an error without a message (", 0), 0u) << line;
  EXPECT_EQ(error_line(std::runtime_error("  \n")).rfind("an error without a message", 0), 0u);
}

TEST(ErrorLine, OrdinaryMessagesPassUnchanged) {
  EXPECT_EQ(error_line(std::runtime_error("config error: file 'c.yaml': unknown key 'x'")),
            "config error: file 'c.yaml': unknown key 'x'");
}
