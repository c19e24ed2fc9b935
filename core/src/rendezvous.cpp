#include "rendezvous.hpp"

#include <hasten/error.hpp>
#include <hasten/logging.hpp>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <mutex>
#include <thread>

#include "text_util.hpp"

namespace hasten::detail {

namespace {

using Clock = std::chrono::steady_clock;

// Keys live under `prefix` (torchrun's agent store is shared by restarts and by others).
class TcpStore final : public Store {
 public:
  TcpStore(c10::intrusive_ptr<c10d::TCPStore> store, int64_t timeout_ms, std::string prefix)
      : store_(std::move(store)), timeout_ms_(timeout_ms), prefix_(std::move(prefix)) {}
  void set(const std::string& k, const std::vector<uint8_t>& value) override {
    const std::string key = prefix_ + k;
    std::lock_guard<std::mutex> lock(mutex_);
    store_->set(key, value);
  }
  std::vector<uint8_t> get(const std::string& k, int64_t timeout_ms) override {
    const std::string key = prefix_ + k;
    const auto timeout = std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : timeout_ms_);
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      store_->wait({key}, timeout);
      return store_->get(key);
    } catch (const std::exception& e) {
      throw Error("store: key '" + k + "' did not appear within " +
                  std::to_string(timeout.count() / 1000.0) + " s (a rank is missing or stuck)");
    }
  }
  int64_t add(const std::string& k, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return store_->add(prefix_ + k, delta);
  }
  bool check(const std::string& k) {
    std::lock_guard<std::mutex> lock(mutex_);
    return store_->check({prefix_ + k});
  }

 private:
  std::mutex mutex_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  int64_t timeout_ms_;
  std::string prefix_;
};

std::string seconds(int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(ms) / 1000.0);
  return buf;
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
  opts.timeout = std::chrono::milliseconds(timeout_ms);
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  try {
    tcp = c10::make_intrusive<c10d::TCPStore>(p.master_addr, opts);
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    if (opts.isServer)
      throw Error("rendezvous: rank 0 cannot host the store at " + where + ": " + why);
    throw Error("rendezvous: rank " + std::to_string(p.rank) + " could not reach rank 0's store at " + where +
                " within " + seconds(timeout_ms) + " s (rank 0 never started or is unreachable): " + why);
  }
  auto store = std::make_unique<TcpStore>(tcp, timeout_ms, prefix);
  const std::string rdzv = "hasten/rdzv/";
  store->set(rdzv + "rank/" + std::to_string(p.rank), {1});
  store->add(rdzv + "arrived", 1);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  if (p.rank == 0) {
    while (store->add(rdzv + "arrived", 0) < p.world_size) {
      if (Clock::now() > deadline) {
        std::vector<std::string> missing;
        for (int r = 0; r < p.world_size; ++r)
          if (!store->check(rdzv + "rank/" + std::to_string(r))) missing.push_back(std::to_string(r));
        throw Error("rendezvous timed out after " + seconds(timeout_ms) + " s at " + where + ": rank" +
                    (missing.size() == 1 ? " " : "s ") + join(missing, ", ") + " of " +
                    std::to_string(p.world_size) + " never joined");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    store->set(rdzv + "complete", {1});
    // Rank 0 hosts the store: it returns only once every rank has read "complete", so that a
    // rank 0 that fails right after rendezvous (a bad option, an exception in user code) and
    // exits cannot take the store away from a rank still inside rendezvous.
    while (store->add(rdzv + "left", 0) < p.world_size - 1) {
      if (Clock::now() > deadline)
        throw Error("rendezvous timed out after " + seconds(timeout_ms) + " s at " + where +
                    ": the other ranks joined but did not all finish");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } else {
    const auto start = Clock::now();
    try {
      store->get(rdzv + "complete", timeout_ms);
      store->add(rdzv + "left", 1);
    } catch (const std::exception&) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      if (waited + 100 < timeout_ms)
        throw Error("rendezvous: rank " + std::to_string(p.rank) + " lost rank 0's store at " + where + " after " +
                    seconds(waited) + " s (rank 0 failed or exited)");
      throw Error("rendezvous timed out after " + seconds(timeout_ms) + " s at " + where + ": rank " +
                  std::to_string(p.rank) + " waited for the other ranks (rank 0 names the missing ones)");
    }
  }
  get_logger()->debug("rendezvous: {} ranks at {}", p.world_size, where);
  return store;
}

}  // namespace hasten::detail
