// Comm plugin "gloo": collectives between the CPU processes of a run over raw Gloo (TCP),
// after a rendezvous through the host's store. C tier: it links libgloo, not LibTorch.
//
// Every operation runs on one worker thread per communicator, in the order it was issued
// (every rank issues the same order), and returns a work item at once. Each operation has
// a Gloo timeout; a wait has its own. A peer that died surfaces as HASTEN_ERR_REMOTE, a peer
// that hangs as HASTEN_ERR_TIMEOUT, each with a message, on every other rank.
#include <hasten/plugin.hpp>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "buffers.hpp"
#include "group_connect.hpp"
#include "reduce_kernels.hpp"

namespace {

using hasten::comm::data_of;
using hasten::comm::element_size;
using hasten::comm::elements;
using hasten::sdk::Error;
using namespace std::chrono_literals;
using ms = std::chrono::milliseconds;

// Gloo's rendezvous store over the host's store.
class HostStore final : public gloo::rendezvous::Store {
 public:
  HostStore(const hasten_host_api* host, int64_t timeout_ms) : host_(host), timeout_ms_(timeout_ms) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    check(host_->store_set(host_, key.c_str(), data.data(), data.size()), "store_set(" + key + ")");
  }
  std::vector<char> get(const std::string& key) override { return get(key, timeout_ms_); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, ms(timeout_ms_)); }
  void wait(const std::vector<std::string>& keys, const ms& timeout) override {
    for (auto& k : keys) get(k, timeout.count());
  }

 private:
  std::vector<char> get(const std::string& key, int64_t timeout_ms) {
    std::vector<char> buf(256);
    size_t size = 0;
    hasten_status st = host_->store_get(host_, key.c_str(), buf.data(), buf.size(), &size, timeout_ms);
    if (st == HASTEN_ERR_INVALID_ARGUMENT && size > buf.size()) {
      buf.resize(size);
      st = host_->store_get(host_, key.c_str(), buf.data(), buf.size(), &size, timeout_ms);
    }
    check(st, "store_get(" + key + ")");
    buf.resize(size);
    return buf;
  }
  void check(hasten_status st, const std::string& what) const {
    if (st != HASTEN_OK)
      throw Error(st == HASTEN_ERR_UNSUPPORTED ? HASTEN_ERR_INVALID_USAGE : st,
                  "gloo rendezvous: " + what + " failed (is a rank missing?)");
  }
  const hasten_host_api* host_;
  int64_t timeout_ms_;
};

// One queued operation and its outcome.
struct Work {
  std::string what;  // the operation, for messages: "allreduce of 272 bytes"
  std::function<void()> run;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  hasten_status status = HASTEN_OK;
  std::string message;
};

hasten_status classify(const std::string& what) {
  if (what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos)
    return HASTEN_ERR_TIMEOUT;
  return HASTEN_ERR_REMOTE;
}



// Checks that `name` resolves to an address this machine can listen on, as Gloo's device
// will need: Gloo itself crashes on a name that does not resolve. Throws an Error naming it.
void require_local_address(const std::string& name, int rank, bool from_options) {
  const std::string what = from_options ? "comm_options.hostname '" + name + "'" : "this machine's hostname '" + name + "'";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr)
    throw Error(HASTEN_ERR_INVALID_ARGUMENT, "gloo: rank " + std::to_string(rank) + ": " + what +
                                                 " does not resolve (" + ::gai_strerror(rc) +
                                                 "); give an address or name of this machine that the other ranks can reach");
  bool bindable = false;
  for (addrinfo* a = found; a != nullptr && !bindable; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    // Port 0 of the resolved address: bindable only if it is one of this machine's.
    bindable = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (!bindable)
    throw Error(HASTEN_ERR_INVALID_ARGUMENT, "gloo: rank " + std::to_string(rank) + ": " + what +
                                                 " resolves to no address of this machine; give one of its own "
                                                 "addresses or names that the other ranks can reach");
}

class GlooComm final : public hasten::sdk::Comm {
 public:
  // CPU buffers over TCP, ranks on any machines.
  static constexpr int32_t kDevices[] = {kDLCPU};
  static constexpr hasten_comm_serves serves = hasten::sdk::comm_serves(kDevices, HASTEN_COMM_SCOPE_ANY, 10);

  GlooComm(const hasten_host_api* host, std::string_view options) : Comm(host), options_(options) {
    // Options: {"hostname": "..."} picks the interface other ranks reach this one on.
    const hasten::sdk::Options o(host, options, "gloo", {"hostname"});
    hostname_ = o.text("hostname").value_or("");
  }

  ~GlooComm() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  // ABI 1.11: a group is a communicator of its own among its members (group_connect.hpp).
  Comm* split(const hasten_comm_split& split) override {
    return hasten::comm::connect_group<GlooComm>(host(), options_, init_, split);
  }

  void init(const hasten_comm_init& init) override {
    init_ = init;
    init_.store_prefix = nullptr;  // borrowed for the call only
    rank_ = init.rank;
    world_ = init.world_size;
    timeout_ = ms(init.timeout_ms > 0 ? init.timeout_ms : 1800000);
    const ms connect_timeout = init.connect_timeout_ms > 0 ? ms(init.connect_timeout_ms) : timeout_;
    const auto info = hasten::sdk::process_info(host());
    gloo::transport::tcp::attr attr;
    // One machine: loopback. Several: this machine's hostname, unless the options say.
    attr.hostname = !hostname_.empty() ? hostname_ : info.num_nodes <= 1 ? "127.0.0.1" : "";
    if (attr.hostname.empty()) {
      char name[256] = {0};
      ::gethostname(name, sizeof name - 1);
      attr.hostname = name;
    }
    require_local_address(attr.hostname, rank_, !hostname_.empty());
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
      store_ = std::make_unique<HostStore>(host(), connect_timeout.count());
      prefix_store_ = std::make_unique<gloo::rendezvous::PrefixStore>(init.store_prefix ? init.store_prefix : "gloo/",
                                                                       *store_);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank_, world_);
      context->setTimeout(connect_timeout);  // the connections; every collective sets its own
      context->connectFullMesh(*prefix_store_, device_);
      context->setTimeout(timeout_);
      context_ = context;
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(HASTEN_ERR_REMOTE, "gloo: rank " + std::to_string(rank_) + ": connecting the ranks failed: " + e.what());
    }
    worker_ = std::thread([this] { loop(); });
  }

  bool supports_device(int32_t device_type) override { return device_type == kDLCPU; }

  hasten_work* allreduce(DLTensor& buffer, hasten_reduce_op op, const hasten_coll_options* options) override {
    hasten::comm::require_cpu_compact(buffer, "gloo", "allreduce");
    const auto kernel = hasten::comm::reduce_kernel(buffer.dtype, op);  // validates dtype and op
    const size_t n = elements(buffer), es = element_size(buffer);
    char* ptr = data_of(buffer);
    const ms timeout = timeout_of(options);
    const DLDataType dtype = buffer.dtype;
    const int world = world_;
    return submit("allreduce of " + std::to_string(n * es) + " bytes", [=] {
      if (n == 0 || world == 1) {
        if (op == HASTEN_REDUCE_AVG) hasten::comm::divide(ptr, n, dtype, world);
        return;
      }
      gloo::AllreduceOptions o(context_);
      set_buffer(o, ptr, n, es);
      o.setReduceFunction(kernel);
      o.setTag(next_tag(1, n * es));
      o.setTimeout(timeout);
      gloo::allreduce(o);
      if (op == HASTEN_REDUCE_AVG) hasten::comm::divide(ptr, n, dtype, world);
    });
  }

  hasten_work* allgather(const DLTensor& input, DLTensor& output, const hasten_coll_options* options) override {
    hasten::comm::require_cpu_compact(input, "gloo", "allgather");
    hasten::comm::require_cpu_compact(output, "gloo", "allgather");
    const size_t in_bytes = elements(input) * element_size(input);
    if (elements(output) * element_size(output) != in_bytes * static_cast<size_t>(world_))
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "gloo allgather: output holds " +
                                                   std::to_string(elements(output) * element_size(output)) +
                                                   " bytes, expected world_size x input = " +
                                                   std::to_string(in_bytes * static_cast<size_t>(world_)));
    char* in = data_of(input);
    char* out = data_of(output);
    const ms timeout = timeout_of(options);
    return submit("allgather of " + std::to_string(in_bytes) + " bytes", [=] {
      if (in_bytes == 0) return;
      gloo::AllgatherOptions o(context_);
      o.setInput<uint8_t>(reinterpret_cast<uint8_t*>(in), in_bytes);
      o.setOutput<uint8_t>(reinterpret_cast<uint8_t*>(out), in_bytes * static_cast<size_t>(world_));
      o.setTag(next_tag(2, in_bytes));
      o.setTimeout(timeout);
      gloo::allgather(o);
    });
  }

  hasten_work* reduce_scatter(const DLTensor& input, DLTensor& output, hasten_reduce_op op,
                              const hasten_coll_options* options) override {
    hasten::comm::require_cpu_compact(input, "gloo", "reduce_scatter");
    hasten::comm::require_cpu_compact(output, "gloo", "reduce_scatter");
    const auto kernel = hasten::comm::reduce_kernel(input.dtype, op);
    const size_t n = elements(input), es = element_size(input);
    if (n % static_cast<size_t>(world_) != 0 || elements(output) * static_cast<size_t>(world_) != n)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                  "gloo reduce_scatter: input of " + std::to_string(n) + " elements must be world_size (" +
                      std::to_string(world_) + ") x output (" + std::to_string(elements(output)) + ")");
    const char* in = data_of(input);
    char* out = data_of(output);
    const ms timeout = timeout_of(options);
    const DLDataType dtype = input.dtype;
    return submit("reduce_scatter of " + std::to_string(n * es) + " bytes", [=] { ring_reduce_scatter(in, out, n / static_cast<size_t>(world_), es, kernel, op, dtype, timeout); });
  }

  hasten_work* broadcast(DLTensor& buffer, int32_t root, const hasten_coll_options* options) override {
    hasten::comm::require_cpu_compact(buffer, "gloo", "broadcast");
    if (root < 0 || root >= world_)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                  "gloo broadcast: root " + std::to_string(root) + " outside [0, " + std::to_string(world_) + ")");
    const size_t bytes = elements(buffer) * element_size(buffer);
    char* ptr = data_of(buffer);
    const ms timeout = timeout_of(options);
    return submit("broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root), [=] {
      if (bytes == 0 || world_ == 1) return;
      gloo::BroadcastOptions o(context_);
      o.setRoot(root);
      o.setOutput<uint8_t>(reinterpret_cast<uint8_t*>(ptr), bytes);
      o.setTag(next_tag(3, bytes + (static_cast<size_t>(root) << 48)));
      o.setTimeout(timeout);
      gloo::broadcast(o);
    });
  }

  hasten_work* barrier(const hasten_coll_options* options) override {
    const ms timeout = timeout_of(options);
    return submit("barrier", [=] {
      if (world_ == 1) return;
      gloo::BarrierOptions o(context_);
      o.setTag(next_tag(4, 0));
      o.setTimeout(timeout);
      gloo::barrier(o);
    });
  }

  void wait(hasten_work* handle, int64_t timeout_ms) override {
    Work* w = reinterpret_cast<Work*>(handle);
    const ms timeout = timeout_ms > 0 ? ms(timeout_ms) : timeout_ + 5s;  // the op's own timeout fires first
    std::unique_lock<std::mutex> lock(w->mutex);
    if (!w->cv.wait_for(lock, timeout, [&] { return w->done; }))
      throw Error(HASTEN_ERR_TIMEOUT, "gloo: collective did not complete within " +
                                          std::to_string(timeout.count() / 1000.0) + " s (a peer may be hung)");
    if (w->status != HASTEN_OK) throw Error(w->status, w->message);
  }

  bool test(hasten_work* handle) override {
    Work* w = reinterpret_cast<Work*>(handle);
    std::lock_guard<std::mutex> lock(w->mutex);
    if (w->done && w->status != HASTEN_OK) throw Error(w->status, w->message);
    return w->done;
  }

  void free_work(hasten_work* handle) noexcept override {
    Work* w = reinterpret_cast<Work*>(handle);
    if (w == nullptr) return;
    {
      // The worker may still be running it: buffers and this item must outlive the op.
      std::unique_lock<std::mutex> lock(w->mutex);
      w->cv.wait(lock, [&] { return w->done; });
    }
    delete w;
  }

  void abort() noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = true;
  }

 private:
  template <class Options>
  static void set_buffer(Options& o, char* ptr, size_t n, size_t es) {
    switch (es) {
      case 1: o.template setOutput<uint8_t>(reinterpret_cast<uint8_t*>(ptr), n); break;
      case 2: o.template setOutput<uint16_t>(reinterpret_cast<uint16_t*>(ptr), n); break;
      case 4: o.template setOutput<uint32_t>(reinterpret_cast<uint32_t*>(ptr), n); break;
      default: o.template setOutput<uint64_t>(reinterpret_cast<uint64_t*>(ptr), n); break;
    }
  }

  ms timeout_of(const hasten_coll_options* o) const {
    return o != nullptr && o->timeout_ms > 0 ? ms(o->timeout_ms) : timeout_;
  }
  // The tag of the next operation: its sequence number in the low 20 bits, and in the high 12
  // a fingerprint of the operation and its size. Ranks that enter different collectives at
  // the same point (one ran fewer steps) then use different Gloo slots and their messages
  // never meet: the operation times out with an error. With equal tags, Gloo's device thread
  // receives a message of the wrong size, fails an enforce on that thread, which no caller
  // can catch, and the process aborts.
  uint32_t next_tag(uint32_t kind, size_t bytes) {
    uint64_t h = 1469598103934665603ull ^ kind;  // FNV-1a over kind and bytes
    for (int i = 0; i < 8; ++i) h = (h ^ ((bytes >> (8 * i)) & 0xff)) * 1099511628211ull;
    return (tag_++ & 0xFFFFFu) | (static_cast<uint32_t>(h & 0xFFFu) << 20);
  }

  // Ring reduce-scatter: W-1 steps; at step s rank r sends its partial sum of chunk
  // (r-s-1) mod W to the right neighbour and adds the left neighbour's partial sum of chunk
  // (r-s-2) mod W to its own. After the last step chunk r holds every rank's contribution.
  void ring_reduce_scatter(const char* in, char* out, size_t chunk, size_t es,
                           const hasten::comm::ReduceFn& kernel, hasten_reduce_op op, DLDataType dtype, ms timeout) {
    const size_t chunk_bytes = chunk * es;
    const int w = world_, r = rank_;
    if (scratch_.size() < chunk_bytes * static_cast<size_t>(w + 1)) scratch_.resize(chunk_bytes * static_cast<size_t>(w + 1));
    char* acc = scratch_.data();
    char* incoming = acc + chunk_bytes * static_cast<size_t>(w);
    std::memcpy(acc, in, chunk_bytes * static_cast<size_t>(w));
    if (w > 1 && chunk > 0) {
      const uint32_t tag = next_tag(5, chunk_bytes);
      const int right = (r + 1) % w, left = (r - 1 + w) % w;
      auto send_buf = context_->createUnboundBuffer(acc, chunk_bytes * static_cast<size_t>(w));
      auto recv_buf = context_->createUnboundBuffer(incoming, chunk_bytes);
      for (int s = 0; s < w - 1; ++s) {
        const auto slot = gloo::Slot::build(0x5c, tag) + static_cast<uint8_t>(s);
        const size_t send_chunk = static_cast<size_t>((r - s - 1 + 2 * w) % w);
        const size_t recv_chunk = static_cast<size_t>((r - s - 2 + 2 * w) % w);
        send_buf->send(right, slot, send_chunk * chunk_bytes, chunk_bytes);
        recv_buf->recv(left, slot, 0, chunk_bytes);
        if (!recv_buf->waitRecv(timeout) || !send_buf->waitSend(timeout))
          throw gloo::IoException("reduce_scatter aborted");
        char* target = acc + recv_chunk * chunk_bytes;
        kernel(target, target, incoming, chunk);
      }
    }
    std::memcpy(out, acc + static_cast<size_t>(r) * chunk_bytes, chunk_bytes);
    if (op == HASTEN_REDUCE_AVG) hasten::comm::divide(out, chunk, dtype, w);
  }

  hasten_work* submit(std::string what, std::function<void()> run) {
    auto* w = new Work();
    w->what = std::move(what);
    w->run = std::move(run);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!context_) {
        delete w;
        throw Error(HASTEN_ERR_INVALID_USAGE, "gloo: collective before init");
      }
      queue_.push_back(w);
    }
    cv_.notify_one();
    return reinterpret_cast<hasten_work*>(w);
  }

  void loop() {
    for (;;) {
      Work* w = nullptr;
      bool aborted = false;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        w = queue_.front();
        queue_.pop_front();
        aborted = aborted_ || broken_;
      }
      hasten_status status = HASTEN_OK;
      std::string message;
      if (aborted) {
        status = HASTEN_ERR_REMOTE;
        message = "gloo: communicator aborted after an earlier failure: " + first_error_;
      } else {
        try {
          w->run();
        } catch (const Error& e) {
          status = e.status();
          message = e.what();
        } catch (const std::exception& e) {
          // gloo::Exception and gloo::EnforceNotMet are std::runtime_errors.
          std::string what = e.what();
          status = classify(what);
          message = "gloo: rank " + std::to_string(rank_) + ": " + w->what +
                    (status == HASTEN_ERR_TIMEOUT
                         ? " timed out (a peer is hung or gone, or the ranks entered different collectives): "
                         : " failed (a peer failed or closed its connection): ") +
                    what.substr(0, what.find('\n'));
        } catch (...) {
          status = HASTEN_ERR_REMOTE;
          message = "gloo: rank " + std::to_string(rank_) + ": " + w->what + " failed with an unknown exception";
        }
        if (status != HASTEN_OK) {
          // The ranks are out of step now: fail everything that follows, promptly.
          std::lock_guard<std::mutex> lock(mutex_);
          broken_ = true;
          first_error_ = message;
        }
      }
      {
        std::lock_guard<std::mutex> lock(w->mutex);
        w->status = status;
        w->message = std::move(message);
        w->done = true;
        w->run = nullptr;
      }
      w->cv.notify_all();
    }
  }

  std::string options_;  // as create() received them: a group's instance gets the same
  hasten_comm_init init_{};
  std::string hostname_;
  int rank_ = 0, world_ = 1;
  ms timeout_{1800000};
  std::shared_ptr<gloo::transport::Device> device_;
  std::unique_ptr<HostStore> store_;
  std::unique_ptr<gloo::rendezvous::PrefixStore> prefix_store_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t tag_ = 0;
  std::vector<char> scratch_;  // reduce-scatter workspace, grown once and reused

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Work*> queue_;
  bool stopping_ = false;
  bool aborted_ = false;
  bool broken_ = false;
  std::string first_error_;
  std::thread worker_;
};

constexpr hasten_plugin_descriptor kGloo = hasten::sdk::comm_descriptor<GlooComm>(
    "gloo", "1.0", "CPU collectives over Gloo's TCP transport, any number of machines");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kGloo)
