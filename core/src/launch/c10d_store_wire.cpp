#include "launch/c10d_store_wire.hpp"

#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "launch/store_client.hpp"
#include "util/text_util.hpp"

namespace hasten::detail {

namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// The outcome of one call, shared with the thread that makes it: a thread stuck in a call
// that never returns keeps it alive after the caller has given up.
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

// c10d's client logs a line for every failed attempt to connect, several a second; hasten's
// rendezvous says in its own words what it waits for. c10d's lines follow c10's log level.
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

// c10d's client blocks in recv() without a deadline for set, add and check, so a store host
// that stopped without closing its sockets would hold the rank forever. Each call therefore
// runs on a thread of its own and the caller waits at most the deadline; a call that misses
// it is left blocked and the connection is broken from then on.
class C10dWire final : public StoreWire {
 public:
  C10dWire(c10::intrusive_ptr<c10d::TCPStore> store, std::string where, std::string prefix)
      : store_(std::move(store)), where_(std::move(where)), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value, int64_t timeout_ms) override {
    bounded("set of key '" + key + "'", timeout_ms, [k = prefix_ + key, value](c10d::TCPStore& s) { s.set(k, value); });
  }
  std::vector<uint8_t> get(const std::string& key, int64_t timeout_ms) override {
    auto out = std::make_shared<std::vector<uint8_t>>();
    bounded("get of key '" + key + "'", timeout_ms, [k = prefix_ + key, out](c10d::TCPStore& s) { *out = s.get(k); });
    return std::move(*out);
  }
  std::vector<uint8_t> wait_get(const std::string& key, int64_t wait_ms) override {
    auto out = std::make_shared<std::vector<uint8_t>>();
    const auto start = Clock::now();
    try {
      // c10d's own wait ends first when the store answers; the margin is for one that does not.
      bounded("wait for key '" + key + "'", wait_ms + 2000, [k = prefix_ + key, wait_ms, out](c10d::TCPStore& s) {
        s.wait({k}, Ms(wait_ms));
        *out = s.get(k);
      });
      return std::move(*out);
    } catch (const StoreClosed& e) {
      // c10d says "timeout" and "connection closed" alike with an exception: its words, or
      // else the time it took, tell them apart.
      const std::string failure = e.what();
      const auto took = std::chrono::duration_cast<Ms>(Clock::now() - start).count();
      const bool timed_out = failure.find("imeout") != std::string::npos || failure.find("timed out") != std::string::npos;
      if (timed_out || took + 100 >= wait_ms)
        throw StoreKeyTimeout("store: key '" + key + "' did not appear within " + seconds_text(wait_ms) + " s");
      throw;
    }
  }
  int64_t add(const std::string& key, int64_t delta, int64_t timeout_ms) override {
    auto out = std::make_shared<int64_t>(0);
    bounded("add to key '" + key + "'", timeout_ms, [k = prefix_ + key, delta, out](c10d::TCPStore& s) { *out = s.add(k, delta); });
    return *out;
  }
  bool check(const std::string& key, int64_t timeout_ms) override {
    auto out = std::make_shared<bool>(false);
    bounded("check of key '" + key + "'", timeout_ms, [k = prefix_ + key, out](c10d::TCPStore& s) { *out = s.check({k}); });
    return *out;
  }

 private:
  template <class Op>
  void bounded(const std::string& what, int64_t timeout_ms, Op op) {
    if (broken_) throw StoreNoAnswer("store: " + what + " refused: an earlier call to the store at " + where_ + " " + broken_why_);
    bool done = false;
    try {
      // The call may outlive its caller (a missed deadline): it holds what it uses.
      done = run_bounded(timeout_ms, [s = store_, serial = serial_, op = std::move(op)] {
        std::lock_guard<std::mutex> one_at_a_time(*serial);
        op(*s);
      });
    } catch (const std::exception& e) {
      const std::string why = e.what();
      throw StoreClosed("store: " + what + " failed at the store at " + where_ + ": " + why.substr(0, why.find('\n')));
    }
    if (!done) {
      broken_why_ = "got no answer within " + seconds_text(timeout_ms) + " s";
      broken_ = true;
      throw StoreNoAnswer("store: " + what + " got no answer from the store at " + where_ + " within " + seconds_text(timeout_ms) +
                          " s (its host stopped, or something that is not a torch store answers on that port)");
    }
  }

  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::string where_;
  std::string prefix_;
  std::shared_ptr<std::mutex> serial_ = std::make_shared<std::mutex>();  // one socket, one request at a time
  std::atomic<bool> broken_{false};  // set by the caller that gave up; read by later callers
  std::string broken_why_;           // written before broken_ is set
};

}  // namespace

std::unique_ptr<StoreWire> connect_c10d_store(const std::string& host, int port, const std::string& key_prefix,
                                              int64_t attempt_ms, int64_t call_timeout_ms) {
  const QuietC10dWhileConnecting quiet;
  const std::string where = host + ":" + std::to_string(port);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.useLibUV = true;
  opts.timeout = Ms(attempt_ms);
  auto made = std::make_shared<c10::intrusive_ptr<c10d::TCPStore>>();
  try {
    // c10d's tries and back-off take up to ~3x its timeout; the margin is for a peer that
    // accepts and then never answers.
    if (!run_bounded(3 * attempt_ms + 5000, [made, host, opts] { *made = c10::make_intrusive<c10d::TCPStore>(host, opts); }))
      throw StoreNoAnswer("got no answer from torchrun's store at " + where);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string why = e.what();
    throw StoreUnreachable(why.substr(0, why.find('\n')));
  }
  (*made)->setTimeout(Ms(call_timeout_ms));
  return std::make_unique<C10dWire>(*made, where, key_prefix);
}

namespace {
// Registers the connector with the rendezvous when libhasten loads.
const bool g_c10d_connector_registered = (c10d_store_connector() = &connect_c10d_store, true);
}  // namespace

}  // namespace hasten::detail
