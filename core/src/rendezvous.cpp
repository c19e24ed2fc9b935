#include "rendezvous.hpp"

#include <hasten/error.hpp>
#include <hasten/logging.hpp>

#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "text_util.hpp"

namespace hasten::detail {

namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// How often a rank that waits says what for.
constexpr Ms kProgressEvery{10000};

std::string seconds(int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(ms) / 1000.0);
  return buf;
}

// The outcome of one store call, shared with the thread that makes it: a thread stuck in a
// call that never returns keeps it alive after the caller has given up.
struct Call {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

// Runs op on a thread of its own and waits at most timeout_ms for it: false when it did not
// finish in time (it is left running, blocked; a socket read cannot be cancelled from outside,
// and the process ends with the error that follows). Rethrows what op threw.
template <class Op>
bool run_bounded(int64_t timeout_ms, Op op) {
  auto call = std::make_shared<Call>();
  std::thread([call, op = std::move(op)]() mutable {
    std::exception_ptr error;
    try {
      op();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(call->mutex);
    call->error = error;
    call->done = true;
    call->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(call->mutex);
  if (!call->cv.wait_for(lock, Ms(timeout_ms), [&] { return call->done; })) return false;
  if (call->error) std::rethrow_exception(call->error);
  return true;
}

// Keys live under `prefix` (torchrun's agent store is shared by restarts and by others).
//
// Every call has a deadline. c10d's client blocks in recv() without one for set, add and
// check, so a store host that stopped without closing its sockets, or a port answered by
// something that is not a store, would hold the rank forever. Each call therefore runs on a
// thread of its own and the caller waits at most the deadline; a call that misses it is left
// blocked (a socket read cannot be cancelled from outside) and the store is broken from then
// on: every later call fails at once, and the run ends with the error.
class TcpStore final : public Store {
 public:
  TcpStore(c10::intrusive_ptr<c10d::TCPStore> store, int64_t call_timeout_ms, std::string prefix,
           std::string where)
      : store_(std::move(store)),
        call_timeout_ms_(call_timeout_ms),
        prefix_(std::move(prefix)),
        where_(std::move(where)),
        serial_(std::make_shared<std::mutex>()) {}

  void set(const std::string& k, const std::vector<uint8_t>& value) override {
    bounded("set of key '" + k + "'", call_timeout_ms_, [s = store_, key = prefix_ + k, value] { s->set(key, value); });
  }
  std::vector<uint8_t> get(const std::string& k, int64_t timeout_ms) override {
    const int64_t wait_ms = timeout_ms > 0 ? timeout_ms : call_timeout_ms_;
    auto value = std::make_shared<std::vector<uint8_t>>();
    std::string failure;
    const auto start = Clock::now();
    try {
      // c10d's own wait ends first when the store answers; the margin is for one that does not.
      bounded("get of key '" + k + "'", wait_ms + 2000, [s = store_, key = prefix_ + k, wait_ms, value] {
        s->wait({key}, Ms(wait_ms));
        *value = s->get(key);
      });
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (failure.empty()) return std::move(*value);
    // c10d says "timeout" and "connection closed" alike with an exception: the time it took
    // tells them apart.
    const auto took = std::chrono::duration_cast<Ms>(Clock::now() - start).count();
    if (took + 100 < wait_ms)
      throw Error("store: the store at " + where_ + " closed the connection while waiting for key '" + k +
                  "' (its host failed or exited): " + failure.substr(0, failure.find('\n')));
    throw Error("store: key '" + k + "' did not appear within " + seconds(wait_ms) + " s (a rank is missing or stuck)");
  }
  int64_t add(const std::string& k, int64_t delta) override {
    auto out = std::make_shared<int64_t>(0);
    bounded("add to key '" + k + "'", call_timeout_ms_, [s = store_, key = prefix_ + k, delta, out] { *out = s->add(key, delta); });
    return *out;
  }
  bool check(const std::string& k) {
    auto out = std::make_shared<bool>(false);
    bounded("check of key '" + k + "'", call_timeout_ms_, [s = store_, key = prefix_ + k, out] { *out = s->check({key}); });
    return *out;
  }

 private:
  // Runs op on its own thread and waits at most timeout_ms for it. Rethrows what op threw
  // (c10d's errors: a closed connection, a missing key); throws hasten::Error on the deadline.
  template <class Op>
  void bounded(const std::string& what, int64_t timeout_ms, Op op) {
    if (broken_) throw Error("store: " + what + " refused: an earlier call to the store at " + where_ + " " + broken_why_);
    const bool done = run_bounded(timeout_ms, [op = std::move(op), serial = serial_] {
      std::lock_guard<std::mutex> one_at_a_time(*serial);  // one socket, one request at a time
      op();
    });
    if (!done) {
      broken_why_ = "got no answer within " + seconds(timeout_ms) + " s";
      broken_ = true;
      throw Error("store: " + what + " got no answer from the store at " + where_ + " within " + seconds(timeout_ms) +
                  " s (its host stopped, or something that is not a hasten/torch store answers on that port)");
    }
  }

  c10::intrusive_ptr<c10d::TCPStore> store_;
  int64_t call_timeout_ms_;
  std::string prefix_;
  std::string where_;
  std::shared_ptr<std::mutex> serial_;
  std::atomic<bool> broken_{false};  // set by the caller that gave up; read by later callers
  std::string broken_why_;          // written before broken_ is set
};

// c10d's client logs a line for every failed attempt to connect ("[c10d] The client socket
// has timed out after 1s while trying to connect to ..."), several a second: a rank that starts
// before rank 0 printed dozens before hasten said in its own words what it waits for, and the
// final error says why from c10d's exception. c10d's lines are enabled by c10's log level
// (c10d::detail::isLogLevelEnabled), so it is raised to fatal-only while connecting.
class QuietC10dWhileConnecting {
 public:
  QuietC10dWhileConnecting() : saved_(FLAGS_caffe2_log_level) {
    if (saved_ < kFatal) FLAGS_caffe2_log_level = kFatal;
  }
  ~QuietC10dWhileConnecting() { FLAGS_caffe2_log_level = saved_; }
  QuietC10dWhileConnecting(const QuietC10dWhileConnecting&) = delete;
  QuietC10dWhileConnecting& operator=(const QuietC10dWhileConnecting&) = delete;

 private:
  static constexpr int kFatal = 3;  // c10's levels: 0 info, 1 warning, 2 error, 3 fatal
  int saved_;
};

// Connects to (rank 0: hosts) the store, retrying in short rounds so that a rank waiting for
// rank 0's store says so every kProgressEvery instead of staying silent until the deadline.
c10::intrusive_ptr<c10d::TCPStore> open_store(const ProcessInfo& p, c10d::TCPStoreOptions opts, const std::string& where,
                                              int64_t timeout_ms) {
  const QuietC10dWhileConnecting quiet;
  const auto start = Clock::now();
  const auto deadline = start + Ms(timeout_ms);
  auto next_report = start + kProgressEvery - Ms(500);
  for (;;) {
    const auto left = std::chrono::duration_cast<Ms>(deadline - Clock::now());
    // c10d retries a refused connection once a second and fails at once when less is left.
    opts.timeout = opts.isServer ? Ms(timeout_ms) : std::max(Ms(1000), std::min(kProgressEvery, left));
    const auto attempt = Clock::now();
    try {
      auto made = std::make_shared<c10::intrusive_ptr<c10d::TCPStore>>();
      // c10d's connect retries within opts.timeout; the margin is for a peer that accepts
      // and then never answers.
      if (!run_bounded(opts.timeout.count() + 5000, [made, addr = p.master_addr, opts] {
            *made = c10::make_intrusive<c10d::TCPStore>(addr, opts);
          }))
        throw Error("rendezvous: rank " + std::to_string(p.rank) + " got no answer from the store at " + where +
                    " (something that is not a hasten/torch store answers on that port)");
      (*made)->setTimeout(Ms(timeout_ms));
      return *made;
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      std::string why = e.what();
      why = why.substr(0, why.find('\n'));
      if (opts.isServer) throw Error("rendezvous: rank 0 cannot host the store at " + where + ": " + why);
      const auto waited = std::chrono::duration_cast<Ms>(Clock::now() - start).count();
      if (Clock::now() + Ms(500) >= deadline)
        throw Error("rendezvous: rank " + std::to_string(p.rank) + " could not reach rank 0's store at " + where +
                    " within " + seconds(timeout_ms) + " s (rank 0 never started or is unreachable): " + why);
      if (Clock::now() >= next_report) {
        get_logger("hasten", false)->info("rendezvous: rank {} waiting for rank 0's store at {} ({} s of {})", p.rank,
                                          where, waited / 1000, timeout_ms / 1000);
        next_report = Clock::now() + kProgressEvery - Ms(500);
      }
      // An attempt that failed at once (nothing listens yet) is not repeated in a busy loop.
      if (Clock::now() - attempt < Ms(1000)) std::this_thread::sleep_for(Ms(200));
    }
  }
}

}  // namespace

std::unique_ptr<Store> rendezvous(const ProcessInfo& p, int64_t timeout_ms) {
  const std::string where = p.master_addr + ":" + std::to_string(p.master_port);
  if (p.master_port <= 0)
    throw Error("rendezvous: MASTER_PORT is not set (this process has rank " + std::to_string(p.rank) +
                " of " + std::to_string(p.world_size) + "; start it with hasten launch, torchrun or srun)");
  // Under torchrun the elastic agent already hosts a store at MASTER_PORT: every rank is a
  // client, and keys go under the agent's per-attempt prefix, as torch's env:// does.
  const Environment env = current_environment();
  const bool agent_store = env.count("TORCHELASTIC_USE_AGENT_STORE") && env.at("TORCHELASTIC_USE_AGENT_STORE") == "True";
  const std::string prefix =
      agent_store ? "/worker/attempt_" + (env.count("TORCHELASTIC_RESTART_COUNT") ? env.at("TORCHELASTIC_RESTART_COUNT") : "0") + "/"
                  : "";
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(p.master_port);
  opts.isServer = p.rank == 0 && !agent_store;
  opts.numWorkers = static_cast<size_t>(p.world_size);
  opts.waitWorkers = false;  // hasten's own wait below names the ranks that are missing
  const auto start = Clock::now();
  const auto deadline = start + Ms(timeout_ms);
  auto store = std::make_unique<TcpStore>(open_store(p, opts, where, timeout_ms), timeout_ms, prefix, where);
  auto waited_s = [&] { return std::chrono::duration_cast<Ms>(Clock::now() - start).count() / 1000; };
  auto next_report = start + kProgressEvery;
  const std::string rdzv = "hasten/rdzv/";
  store->set(rdzv + "rank/" + std::to_string(p.rank), {1});
  store->add(rdzv + "arrived", 1);
  if (p.rank == 0) {
    auto missing_ranks = [&] {
      std::vector<std::string> missing;
      for (int r = 0; r < p.world_size; ++r)
        if (!store->check(rdzv + "rank/" + std::to_string(r))) missing.push_back(std::to_string(r));
      return "rank" + std::string(missing.size() == 1 ? " " : "s ") + join(missing, ", ") + " of " +
             std::to_string(p.world_size);
    };
    while (store->add(rdzv + "arrived", 0) < p.world_size) {
      if (Clock::now() > deadline)
        throw Error("rendezvous timed out after " + seconds(timeout_ms) + " s at " + where + ": " + missing_ranks() +
                    " never joined");
      if (Clock::now() >= next_report) {
        get_logger()->info("rendezvous: waiting for {} at {} ({} s of {})", missing_ranks(), where, waited_s(),
                           timeout_ms / 1000);
        next_report += kProgressEvery;
      }
      std::this_thread::sleep_for(Ms(10));
    }
    store->set(rdzv + "complete", {1});
    // Rank 0 hosts the store: it returns only once every rank has read "complete", so that a
    // rank 0 that fails right after rendezvous (a bad option, an exception in user code) and
    // exits cannot take the store away from a rank still inside rendezvous.
    while (store->add(rdzv + "left", 0) < p.world_size - 1) {
      if (Clock::now() > deadline)
        throw Error("rendezvous timed out after " + seconds(timeout_ms) + " s at " + where +
                    ": the other ranks joined but did not all finish");
      std::this_thread::sleep_for(Ms(1));
    }
  } else {
    // Waits for "complete" in rounds of kProgressEvery, saying what it waits for after each.
    for (;;) {
      const auto left = std::chrono::duration_cast<Ms>(deadline - Clock::now()).count();
      const int64_t round = std::max<int64_t>(1, std::min<int64_t>(kProgressEvery.count(), left));
      try {
        store->get(rdzv + "complete", round);
        break;
      } catch (const Error& e) {
        const std::string what = e.what();
        if (what.find("closed the connection") != std::string::npos)
          throw Error("rendezvous: rank " + std::to_string(p.rank) + " lost rank 0's store at " + where + " after " +
                      std::to_string(waited_s()) + " s (rank 0 failed or exited)");
        if (what.find("did not appear") == std::string::npos) throw;  // no answer at all: named already
      }
      if (Clock::now() >= deadline)
        throw Error("rendezvous timed out after " + seconds(timeout_ms) + " s at " + where + ": rank " +
                    std::to_string(p.rank) + " waited for the other ranks (rank 0 names the missing ones)");
      get_logger("hasten", false)->info("rendezvous: rank {} waiting for rank 0 to see all {} ranks at {} ({} s of {})", p.rank,
                         p.world_size, where, waited_s(), timeout_ms / 1000);
    }
    store->add(rdzv + "left", 1);
  }
  get_logger()->debug("rendezvous: {} ranks at {}", p.world_size, where);
  return store;
}

}  // namespace hasten::detail
