// hasten::launch's workers die with the process that launched them, even when it is killed
// with SIGKILL and has no chance to stop them itself.
#include <hasten/launch.hpp>

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace {

// A process that is gone or only a zombie (reparented orphans are reaped by init a moment
// later; a zombie no longer runs anything).
bool gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

TEST(LaunchOrphans, WorkersDieWhenTheCallerIsKilled) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t caller = ::fork();
  ASSERT_GE(caller, 0);
  if (caller == 0) {
    ::close(fds[0]);
    const int out = fds[1];
    hasten::LaunchOptions options;
    options.num_processes = 2;
    options.timeout_s = 120;
    try {
      hasten::launch(
          [out] {
            const pid_t self = ::getpid();
            if (::write(out, &self, sizeof self) != static_cast<ssize_t>(sizeof self)) ::_exit(2);
            for (;;) ::pause();
          },
          options);
    } catch (...) {
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  pid_t workers[2] = {-1, -1};
  for (pid_t& w : workers) ASSERT_EQ(::read(fds[0], &w, sizeof w), static_cast<ssize_t>(sizeof w));
  ::close(fds[0]);
  ASSERT_FALSE(gone(workers[0]));
  ASSERT_FALSE(gone(workers[1]));

  ::kill(caller, SIGKILL);
  int status = 0;
  ::waitpid(caller, &status, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((!gone(workers[0]) || !gone(workers[1])) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const bool left0 = !gone(workers[0]), left1 = !gone(workers[1]);
  for (pid_t w : workers)
    if (!gone(w)) ::kill(w, SIGKILL);  // never leave them running, whatever the outcome
  EXPECT_FALSE(left0) << "worker " << workers[0] << " outlived its killed launcher";
  EXPECT_FALSE(left1) << "worker " << workers[1] << " outlived its killed launcher";
}

}  // namespace
