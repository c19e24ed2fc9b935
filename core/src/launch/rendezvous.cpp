#include "launch/rendezvous.hpp"

#include <hasten/error.hpp>
#include <hasten/logging.hpp>

#include <hasten/detail/launch_contract.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "launch/c10d_store_wire.hpp"
#include "launch/store_client.hpp"
#include "launch/store_server.hpp"
#include "util/text_util.hpp"

namespace hasten::detail {

C10dStoreConnector& c10d_store_connector() {
  static C10dStoreConnector connector = nullptr;
  return connector;
}

namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// How often a rank that waits says what for.
constexpr Ms kProgressEvery{10000};

// One connection to the run's store per process (rank 0: also the store's host), shared by
// every Accelerator the process makes: a second Accelerator, alive with the first or made
// after it, must not bind the port again (it is taken) nor lose the store its peers still
// talk to. Each Accelerator is one generation of keys under it (below), so their keys never
// meet. Every call on the wire has a deadline (store_wire.hpp).
struct Connection {
  std::unique_ptr<StoreWire> wire;
  std::string where;
  int rank = 0, world = 1;
  bool hosts = false;  // rank 0 outside torchrun: the store lives in this process
  int64_t timeout_ms = 0;
  int64_t generations = 0;  // Accelerators this process made on this store
  std::mutex exit_waits_mutex;
  std::vector<std::pair<std::string, int64_t>> exit_waits;  // counters the host waits for at exit

  int64_t add(const std::string& key, int64_t delta, int64_t timeout) { return wire->add(key, delta, timeout); }
  bool check(const std::string& key, int64_t timeout) { return wire->check(key, timeout); }
  void set(const std::string& key, const std::vector<uint8_t>& value, int64_t timeout) { wire->set(key, value, timeout); }
  std::vector<uint8_t> get_now(const std::string& key, int64_t timeout) { return wire->get(key, timeout); }
};

// A short deadline for calls made on the way out (a departure note, the exit wait): they must
// not hold a process that is ending for the store's full timeout.
constexpr int64_t kLeavingCallMs = 2000;

// "host pid" of every rank's process, published once per connection: a peer on this machine
// whose process is gone is reported as exited instead of waited for.
std::string process_tag() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return std::string(host) + " " + std::to_string(::getpid());
}

// Empty while rank's process may be running; otherwise what became of it.
std::string process_gone(Connection& c, int rank) {
  if (!c.check("hasten/proc/" + std::to_string(rank), kLeavingCallMs)) return "";
  const auto v = c.get_now("hasten/proc/" + std::to_string(rank), kLeavingCallMs);
  const std::string tag(v.begin(), v.end()), mine = process_tag();
  const auto space = tag.rfind(' ');
  if (space == std::string::npos || tag.substr(0, space) != mine.substr(0, mine.rfind(' '))) return "";
  const pid_t pid = static_cast<pid_t>(std::stol(tag.substr(space + 1)));
  if (::kill(pid, 0) == 0 || errno != ESRCH) return "";
  return "its process (pid " + std::to_string(pid) + ") exited";
}

// The store one Accelerator uses: its generation's keys ("hasten/g<N>/...") on the process's
// connection. Its end is noted in the store, so that peers waiting for this rank (debug mode)
// hear that it left instead of waiting out their deadline.
class TcpStore final : public Store {
 public:
  TcpStore(std::shared_ptr<Connection> c, int64_t call_timeout_ms, int64_t generation)
      : c_(std::move(c)), call_timeout_ms_(call_timeout_ms), keys_("hasten/g" + std::to_string(generation) + "/") {}
  ~TcpStore() override {
    try {
      if (setting_up_) c_->add("hasten/setting_up/" + std::to_string(c_->rank), -1, kLeavingCallMs);
      c_->set(keys_ + "gone/" + std::to_string(c_->rank), {1}, kLeavingCallMs);
    } catch (...) {
      // The store is gone or broken: nobody is left to tell.
    }
  }

  // Rank 0's process waits at exit until no rank is still setting up through its store.
  void begin_setup() {
    c_->add("hasten/setting_up/" + std::to_string(c_->rank), 1, call_timeout_ms_);
    setting_up_ = true;
  }
  void setup_finished() override {
    if (!setting_up_) return;
    setting_up_ = false;
    c_->add("hasten/setting_up/" + std::to_string(c_->rank), -1, call_timeout_ms_);
  }

  void set(const std::string& k, const std::vector<uint8_t>& value) override { c_->set(keys_ + k, value, call_timeout_ms_); }
  std::vector<uint8_t> get(const std::string& k, int64_t timeout_ms) override {
    const int64_t wait_ms = timeout_ms > 0 ? timeout_ms : call_timeout_ms_;
    try {
      return c_->wire->wait_get(keys_ + k, wait_ms);
    } catch (const StoreKeyTimeout&) {
      throw Error("store: key '" + k + "' did not appear within " + seconds_text(wait_ms) + " s (a rank is missing or stuck)");
    } catch (const StoreClosed& e) {
      throw Error("store: the store at " + c_->where + " closed the connection while waiting for key '" + k +
                  "' (its host failed or exited): " + std::string(e.what()));
    }
  }
  int64_t add(const std::string& k, int64_t delta) override { return c_->add(keys_ + k, delta, call_timeout_ms_); }
  bool check(const std::string& k) { return c_->check(keys_ + k, call_timeout_ms_); }

  void hold_at_exit_until(const std::string& key, int64_t count) override {
    if (!c_->hosts) return;
    std::lock_guard<std::mutex> lock(c_->exit_waits_mutex);
    c_->exit_waits.emplace_back(keys_ + key, count);
  }

  std::string departed(int rank) override {
    try {
      if (c_->check(keys_ + "gone/" + std::to_string(rank), kLeavingCallMs))
        return "it left (its Accelerator was destroyed, or its process returned)";
      return process_gone(*c_, rank);
    } catch (...) {
      return "the store's host, rank 0, is gone (its process exited or failed)";
    }
  }

 private:
  std::shared_ptr<Connection> c_;
  int64_t call_timeout_ms_;
  std::string keys_;
  bool setting_up_ = false;
};

// The process's connections, by store address and key prefix; kept until the process exits.
std::mutex& connections_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<std::string, std::shared_ptr<Connection>>& connections() {
  static auto* all = new std::map<std::string, std::shared_ptr<Connection>>;
  return *all;
}

void release_at_exit() { release_stores_before_exit(); }

// Connects to (rank 0: hosts, then connects to) the store, retrying until timeout_ms so that
// a rank started before rank 0 listens waits for it, saying so every kProgressEvery.
// `attempt(attempt_ms, left_ms)` makes one try: StoreUnreachable means try again.
template <class Attempt>
std::unique_ptr<StoreWire> open_store(const ProcessInfo& p, const std::string& where, int64_t timeout_ms, Attempt attempt) {
  const auto start = Clock::now();
  const auto deadline = start + Ms(timeout_ms);
  auto next_report = start + kProgressEvery - Ms(500);
  // c10d's client (torchrun's store) makes two tries of its timeout each with a randomised
  // back-off of up to about that timeout between them, so one attempt takes up to ~3x it: a
  // rank that starts a moment before the store listens would lose that much. The first
  // attempts are therefore short (100 ms) and repeated every 20 ms; from 1 s on, rounds of a
  // third of kProgressEvery take over (a slow network then has at least a second per try), so
  // that the progress line still comes every kProgressEvery.
  constexpr Ms kQuick{100};
  for (;;) {
    const auto left = std::max(std::chrono::duration_cast<Ms>(deadline - Clock::now()), Ms(1));
    const bool early = Clock::now() - start < Ms(1000);
    const Ms attempt_ms = early ? std::min(kQuick, left) : std::max(Ms(1000), std::min(kProgressEvery, left) / 3);
    const auto tried = Clock::now();
    try {
      return attempt(attempt_ms.count(), left.count());
    } catch (const StoreNoAnswer&) {
      throw Error("rendezvous: rank " + std::to_string(p.rank) + " got no answer from the store at " + where +
                  " (something that is not a hasten/torch store answers on that port)");
    } catch (const StoreRefused& e) {
      throw Error("rendezvous: rank " + std::to_string(p.rank) + ": " + e.what() +
                  " (is another run using this MASTER_PORT?)");
    } catch (const StoreClosed&) {
      throw Error("rendezvous: rank " + std::to_string(p.rank) + ": the store at " + where +
                  " closed the connection at the hello (something that is not a hasten store answers on that port)");
    } catch (const StoreUnreachable& e) {
      std::string why = e.what();
      const auto waited = std::chrono::duration_cast<Ms>(Clock::now() - start).count();
      // The progress line comes before the deadline check: one attempt can take up to ~3x
      // its timeout, so the attempt that spans the report time may also be the last one, and
      // a wait that was due to be reported must still be said.
      if (Clock::now() >= next_report) {
        get_logger("hasten", false)->info("rendezvous: rank {} waiting for rank 0's store at {} ({} s of {})", p.rank,
                                          where, (waited + 500) / 1000, timeout_ms / 1000);
        next_report = Clock::now() + kProgressEvery - Ms(500);
      }
      if (Clock::now() + Ms(500) >= deadline)
        throw Error("rendezvous: rank " + std::to_string(p.rank) + " could not reach rank 0's store at " + where +
                    " within " + seconds_text(timeout_ms) + " s (rank 0 never started or is unreachable): " + why);
      // An attempt that failed at once (nothing listens yet) is not repeated in a busy loop.
      if (early)
        std::this_thread::sleep_for(Ms(20));
      else if (Clock::now() - tried < Ms(1000))
        std::this_thread::sleep_for(Ms(200));
    }
  }
}

}  // namespace

std::unique_ptr<Store> rendezvous(const ProcessInfo& p, int64_t timeout_ms) {
  const std::string where = p.master_addr + ":" + std::to_string(p.master_port);
  if (p.master_port <= 0)
    throw Error("rendezvous: MASTER_PORT is not set (this process has rank " + std::to_string(p.rank) +
                " of " + std::to_string(p.world_size) + "; start it with hasten launch, torchrun, srun or mpirun)");
  // Under torchrun the elastic agent already hosts a store at MASTER_PORT: every rank is a
  // client, and keys go under the agent's per-attempt prefix, as torch's env:// does.
  const Environment env = current_environment();
  const bool agent_store = env.count("TORCHELASTIC_USE_AGENT_STORE") && env.at("TORCHELASTIC_USE_AGENT_STORE") == "True";
  const std::string prefix =
      agent_store ? "/worker/attempt_" + (env.count("TORCHELASTIC_RESTART_COUNT") ? env.at("TORCHELASTIC_RESTART_COUNT") : "0") + "/"
                  : "";
  const auto start = Clock::now();
  const auto deadline = start + Ms(timeout_ms);
  std::shared_ptr<Connection> connection;
  int64_t generation = 0;
  {
    // Accelerators made one after another (or both alive) share the connection; the n-th
    // Accelerator of every rank meets the n-th of the others under generation n's keys.
    std::lock_guard<std::mutex> lock(connections_mutex());
    auto& mine = connections()[where + " " + prefix];
    if (!mine) {
      auto c = std::make_shared<Connection>();
      if (agent_store) {
        const C10dStoreConnector connect = c10d_store_connector();
        if (connect == nullptr)
          throw Error("rendezvous: joining torchrun's store at " + where +
                      " needs LibTorch's c10d client, which only libhasten links (this program has launch/ alone)");
        c->wire = open_store(p, where, timeout_ms, [&](int64_t attempt_ms, int64_t) {
          return connect(p.master_addr, p.master_port, prefix, attempt_ms, timeout_ms);
        });
      } else {
        // hasten's own store, authenticated by the run's token (HASTEN_RUN_TOKEN, made by the
        // launcher; without one the store is open to whoever reaches it, as c10d's is).
        const auto token_it = env.find(kRunTokenVariable);
        const std::string token = token_it == env.end() ? "" : token_it->second;
        check_run_token(token);
        std::string connect_host = p.master_addr;
        if (p.rank == 0) {
          // Loopback for a run on one machine; the address the others reach otherwise.
          const auto bind = env.find("HASTEN_BIND_ADDR");
          std::string note;
          const std::string bind_host =
              listen_address(p.master_addr, p.num_nodes > 1 || p.local_world_size < p.world_size,
                             bind == env.end() ? "" : bind->second, &note);
          if (!note.empty()) get_logger()->info("rendezvous: {}", note);
          StoreServerOptions server;
          server.bind_host = bind_host;
          server.port = p.master_port;
          server.token = token;
          server.max_clients = 2 * p.world_size + 16;
          try {
            start_store_server(server);
          } catch (const Error& e) {
            if (p.master_port_source.empty()) throw;
            throw Error(std::string(e.what()) + " (port " + std::to_string(p.master_port) + " comes from " +
                        p.master_port_source + ": set MASTER_PORT to choose another)");
          }
          if (token.empty() && !is_loopback_address(bind_host))
            get_logger()->warn("rendezvous: the store at {}:{} has no run token ({} is not set): anyone who reaches "
                               "that address can read and write the run's keys, as with PyTorch's TCPStore; see "
                               "docs/launch.md, \"Network and trust\"",
                               bracketed_host(bind_host), p.master_port, kRunTokenVariable);
          if (bind_host != "0.0.0.0" && bind_host != "::") connect_host = bind_host;
        }
        c->wire = open_store(p, where, timeout_ms, [&](int64_t attempt_ms, int64_t left_ms) {
          return connect_store(connect_host, p.master_port, token, attempt_ms, left_ms);
        });
      }
      c->where = where;
      c->rank = p.rank;
      c->world = p.world_size;
      c->hosts = p.rank == 0 && !agent_store;
      c->timeout_ms = timeout_ms;
      const std::string tag = process_tag();
      c->set("hasten/proc/" + std::to_string(p.rank), std::vector<uint8_t>(tag.begin(), tag.end()), timeout_ms);
      static std::once_flag at_exit;
      std::call_once(at_exit, [] { std::atexit(release_at_exit); });
      mine = c;
    } else if (mine->rank != p.rank || mine->world != p.world_size) {
      throw Error("rendezvous: this process already joined the store at " + where + " as rank " +
                  std::to_string(mine->rank) + " of " + std::to_string(mine->world) + ", not rank " +
                  std::to_string(p.rank) + " of " + std::to_string(p.world_size));
    }
    connection = mine;
    generation = connection->generations++;
  }
  auto store = std::make_unique<TcpStore>(connection, timeout_ms, generation);
  store->begin_setup();
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
        throw Error("rendezvous timed out after " + seconds_text(timeout_ms) + " s at " + where + ": " + missing_ranks() +
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
        throw Error("rendezvous timed out after " + seconds_text(timeout_ms) + " s at " + where +
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
        throw Error("rendezvous timed out after " + seconds_text(timeout_ms) + " s at " + where + ": rank " +
                    std::to_string(p.rank) + " waited for the other ranks (rank 0 names the missing ones)");
      get_logger("hasten", false)->info("rendezvous: rank {} waiting for rank 0 to see all {} ranks at {} ({} s of {})", p.rank,
                         p.world_size, where, waited_s(), timeout_ms / 1000);
    }
    store->add(rdzv + "left", 1);
  }
  get_logger()->debug("rendezvous: {} ranks at {} (Accelerator #{} of this process)", p.world_size, where, generation);
  return store;
}

// Rank 0's process hosts the store: it stays at exit until no rank is still setting up
// through it (a peer that is still connecting its comm backend would otherwise lose the
// store mid-way: "Broken pipe"). Setting up is short and bounded by its own deadline; a peer
// on this machine whose process is gone is not waited for. Other ranks just close.
void release_stores_before_exit() {
  std::map<std::string, std::shared_ptr<Connection>> all;
  {
    std::lock_guard<std::mutex> lock(connections_mutex());
    all.swap(connections());
  }
  for (auto& [where, c] : all) {
    if (!c->hosts) continue;
    const auto deadline = Clock::now() + Ms(c->timeout_ms);
    try {
      for (int r = 1; r < c->world; ++r)
        while (c->add("hasten/setting_up/" + std::to_string(r), 0, kLeavingCallMs) > 0 && Clock::now() < deadline &&
               process_gone(*c, r).empty())
          std::this_thread::sleep_for(Ms(2));
      // Counters peers still have to complete (hold_at_exit_until), for at most 10 s more.
      std::vector<std::pair<std::string, int64_t>> waits;
      {
        std::lock_guard<std::mutex> lock(c->exit_waits_mutex);
        waits = c->exit_waits;
      }
      const auto hold_deadline = std::min(deadline, Clock::now() + Ms(10000));
      auto anyone_gone = [&] {
        for (int r = 1; r < c->world; ++r)
          if (!process_gone(*c, r).empty()) return true;
        return false;
      };
      for (auto& [key, count] : waits)
        while (c->add(key, 0, kLeavingCallMs) < count && Clock::now() < hold_deadline && !anyone_gone())
          std::this_thread::sleep_for(Ms(2));
    } catch (...) {
      // A broken store: nobody can use it any more.
    }
  }
}

}  // namespace hasten::detail
