// The in-process launcher: fork workers, give each the torchrun environment contract
// (launch_contract.cpp) and supervise them with the loop `hasten launch` uses
// (worker_supervisor.cpp: the first failure stops the others).
#include <hasten/detail/launch_contract.hpp>
#include <hasten/detail/worker_supervisor.hpp>
#include <hasten/error.hpp>
#include <hasten/launch.hpp>

#include <dlfcn.h>
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

#include "launch/rendezvous.hpp"

namespace hasten {

namespace {

// Whether this process has initialised CUDA (any CUDA tensor, or only
// torch::cuda::is_available(), which runs cuInit): the driver's state does not survive fork, so
// forked workers would fail or hang on their first CUDA call. Asked of the driver already loaded
// (nothing is loaded or initialised here): no libcuda in the process, or cuDeviceGetCount
// failing with CUDA_ERROR_NOT_INITIALIZED, means CUDA was never initialised.
bool cuda_initialised() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return false;
  using count_fn = int (*)(int*);
  auto count = reinterpret_cast<count_fn>(::dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  const bool initialised = count != nullptr && count(&n) == 0;
  ::dlclose(lib);
  return initialised;
}

}  // namespace

void launch(const std::function<void()>& fn, const LaunchOptions& options) {
  const int n = options.num_processes;
  if (n < 1) throw Error("hasten::launch: num_processes must be >= 1, got " + std::to_string(n));
  if (cuda_initialised())
    throw Error("hasten::launch: this process has already initialised CUDA, and forked workers cannot use it; "
                "call hasten::launch before any CUDA work (as Accelerate's notebook_launcher requires), or start "
                "the workers with `hasten launch`");
  // Workers of one machine rendezvous on the loopback address.
  const int port = detail::pick_free_port(/*loopback_only=*/true);
  if (port == 0) throw Error("hasten::launch: cannot find a free port for the rendezvous");
  // The run's secret: the workers' store refuses a client that does not present it.
  const std::string token = detail::make_run_token();
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  // Workers share the caller's process group: a Ctrl-C at the terminal reaches them directly.
  detail::WorkerSupervisor supervisor(options.grace_s, /*process_groups=*/false);
  for (int r = 0; r < n; ++r) {
    detail::WorkerPlace place;
    place.rank = place.local_rank = r;
    place.world_size = place.local_world_size = n;
    place.master_addr = "127.0.0.1";
    place.master_port = port;
    const auto contract = detail::torchrun_env(place);  // the caller's env entries win over it
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0)  // the supervisor kills the workers already started
      throw Error(std::string("hasten::launch: fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      // A caller killed with SIGKILL cannot stop its workers: the kernel does it. The signal
      // comes when the thread that called launch() ends (launch.hpp says so). A parent that
      // died between fork and prctl has already reparented us: nothing would ever fire.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(128 + SIGKILL);
      for (auto& [k, v] : contract) ::setenv(k.c_str(), v.c_str(), 1);
      ::setenv(detail::kRunTokenVariable, token.c_str(), 1);
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
      detail::release_stores_before_exit();  // what atexit would do: rank 0 keeps the store for peers setting up
      std::cout.flush();
      std::cerr.flush();
      std::fflush(nullptr);
      ::_exit(code);  // no atexit handlers or static destructors of the parent's program
    }
    supervisor.add(r, pid);
  }

  // The stop policy is the one `hasten launch` applies (worker_supervisor.hpp); what is
  // left here is the deadline of the whole launch.
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  bool timed_out = false;
  while (supervisor.any_running()) {
    supervisor.collect();
    if (!supervisor.any_running()) break;
    if (!supervisor.stopping() && clock::now() > deadline) {
      timed_out = true;
      supervisor.stop(SIGTERM);
    }
    supervisor.enforce_grace();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (const int failed = supervisor.first_failure(); failed >= 0) {
    const auto i = static_cast<size_t>(failed);
    throw Error("hasten::launch: " +
                detail::describe_worker_exit(supervisor.rank(i), supervisor.pid(i), supervisor.status(i)));
  }
  if (timed_out)
    throw Error("hasten::launch: the workers did not finish within " + std::to_string(options.timeout_s) + " s");
}

}  // namespace hasten
