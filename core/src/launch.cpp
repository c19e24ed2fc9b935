// The in-process launcher: fork workers, give each the torchrun environment contract
// (launch_contract.cpp, shared with `hasten launch`), and treat their exits as `hasten launch`
// does (first failure stops the others).
#include <hasten/detail/launch_contract.hpp>
#include <hasten/error.hpp>
#include <hasten/launch.hpp>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

namespace hasten {

void launch(const std::function<void()>& fn, const LaunchOptions& options) {
  const int n = options.num_processes;
  if (n < 1) throw Error("hasten::launch: num_processes must be >= 1, got " + std::to_string(n));
  // Workers of one machine rendezvous on the loopback address.
  const int port = detail::pick_free_port(/*loopback_only=*/true);
  if (port == 0) throw Error("hasten::launch: cannot find a free port for the rendezvous");
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::vector<pid_t> pids(static_cast<size_t>(n), -1);
  for (int r = 0; r < n; ++r) {
    detail::WorkerPlace place;
    place.rank = place.local_rank = r;
    place.world_size = place.local_world_size = n;
    place.master_addr = "127.0.0.1";
    place.master_port = port;
    const auto contract = detail::torchrun_env(place);  // the caller's env entries win over it
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGKILL);
      throw Error(std::string("hasten::launch: fork failed: ") + std::strerror(errno));
    }
    if (pid == 0) {
      // A caller killed with SIGKILL cannot stop its workers: the kernel does it. The signal
      // comes when the thread that called launch() ends (launch.hpp says so). A parent that
      // died between fork and prctl has already reparented us: nothing would ever fire.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(128 + SIGKILL);
      for (auto& [k, v] : contract) ::setenv(k.c_str(), v.c_str(), 1);
      for (auto& [k, v] : options.env) ::setenv(k.c_str(), v.c_str(), 1);
      int code = 0;
      try {
        fn();
      } catch (const std::exception& e) {
        std::cerr << "hasten::launch: rank " << r << ": " << e.what() << std::endl;
        code = 1;
      } catch (...) {
        std::cerr << "hasten::launch: rank " << r << ": unknown exception" << std::endl;
        code = 1;
      }
      std::cout.flush();
      std::cerr.flush();
      std::fflush(nullptr);
      ::_exit(code);  // no atexit handlers or static destructors of the parent's program
    }
    pids[static_cast<size_t>(r)] = pid;
  }

  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  std::vector<int> status(static_cast<size_t>(n), 0);
  std::vector<bool> running(static_cast<size_t>(n), true);
  int failed = -1, left = n;
  bool timed_out = false;
  clock::time_point kill_at{};
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (!running[static_cast<size_t>(r)]) continue;
      int st = 0;
      if (::waitpid(pids[static_cast<size_t>(r)], &st, WNOHANG) == pids[static_cast<size_t>(r)]) {
        running[static_cast<size_t>(r)] = false;
        status[static_cast<size_t>(r)] = st;
        --left;
        if (failed < 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
          failed = r;
          for (int o = 0; o < n; ++o)
            if (running[static_cast<size_t>(o)]) ::kill(pids[static_cast<size_t>(o)], SIGTERM);
          kill_at = clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.grace_s * 1000));
        }
      }
    }
    if (left == 0) break;
    const auto now = clock::now();
    if (!timed_out && failed < 0 && now > deadline) {
      timed_out = true;
      for (int o = 0; o < n; ++o)
        if (running[static_cast<size_t>(o)]) ::kill(pids[static_cast<size_t>(o)], SIGTERM);
      kill_at = now + std::chrono::milliseconds(static_cast<int64_t>(options.grace_s * 1000));
    }
    if ((failed >= 0 || timed_out) && now > kill_at)
      for (int o = 0; o < n; ++o)
        if (running[static_cast<size_t>(o)]) ::kill(pids[static_cast<size_t>(o)], SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (failed >= 0)
    throw Error("hasten::launch: " + detail::describe_worker_exit(failed, pids[static_cast<size_t>(failed)],
                                                                  status[static_cast<size_t>(failed)]));
  if (timed_out)
    throw Error("hasten::launch: the workers did not finish within " + std::to_string(options.timeout_s) + " s");
}

}  // namespace hasten
