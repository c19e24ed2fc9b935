// An out-of-tree comm plugin that the core picks on its own: it declares that it serves CPU
// buffers on any machines with a priority above every first-party backend, so `comm: auto`
// selects it without the core knowing its name. Collectives go through the host's
// rendezvous store (slow, simple) and complete before returning (NULL work).
#include <hasten/plugin.hpp>

#include <algorithm>
#include <chrono>
#include <thread>
#include <string>
#include <vector>

namespace {

using hasten::sdk::Error;

class StoreComm final : public hasten::sdk::Comm {
 public:
  static constexpr int32_t kDevices[] = {kDLCPU};
  static constexpr hasten_comm_serves serves = hasten::sdk::comm_serves(kDevices, HASTEN_COMM_SCOPE_ANY, 1000);

  StoreComm(const hasten_host_api* host, std::string_view options) : Comm(host) {
    hasten::sdk::require_no_options(options, "oot_store");
  }
  void init(const hasten_comm_init& init) override {
    rank_ = init.rank, world_ = init.world_size, prefix_ = init.store_prefix;
    hasten::sdk::log(host(), HASTEN_LOG_INFO, "oot_store",
                     "oot_store comm: rank " + std::to_string(rank_) + " of " + std::to_string(world_) + " connected");
  }
  // Rank 0 hosts the store: it leaves only after every rank has read what it needs (the
  // last collective's keys live in the store, not in this process).
  ~StoreComm() override {
    if (world_ <= 1) return;
    const std::string key = prefix_ + "exit";
    int64_t n = 0;
    if (host()->store_add(host(), key.c_str(), 1, &n) != HASTEN_OK || rank_ != 0) return;
    for (int i = 0; i < 60000 && n < world_; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (host()->store_add(host(), key.c_str(), 0, &n) != HASTEN_OK) return;
    }
  }
  bool supports_device(int32_t device_type) override { return device_type == kDLCPU; }

  hasten_work* allreduce(DLTensor& b, hasten_reduce_op op, const hasten_coll_options*) override {
    auto all = exchange(bytes(b));
    if (b.dtype.code == kDLFloat && b.dtype.bits == 32) reduce<float>(all, b, op);
    else if (b.dtype.code == kDLFloat && b.dtype.bits == 64) reduce<double>(all, b, op);
    else if (b.dtype.code == kDLInt && b.dtype.bits == 64) reduce<int64_t>(all, b, op);
    else throw Error(HASTEN_ERR_UNSUPPORTED, "oot_store: allreduce handles float32, float64 and int64");
    return nullptr;  // completed: the host neither waits on nor frees it
  }
  hasten_work* allgather(const DLTensor& in, DLTensor& out, const hasten_coll_options*) override {
    auto all = exchange(bytes(in));
    char* dst = data(out);
    for (auto& piece : all) dst = std::copy(piece.begin(), piece.end(), dst);
    return nullptr;
  }
  hasten_work* broadcast(DLTensor& b, int32_t root, const hasten_coll_options*) override {
    auto all = exchange(rank_ == root ? bytes(b) : std::vector<char>{});
    std::copy(all[root].begin(), all[root].end(), data(b));
    return nullptr;
  }
  hasten_work* barrier(const hasten_coll_options*) override {
    exchange({});
    return nullptr;
  }
  void wait(hasten_work*, int64_t) override {}
  void free_work(hasten_work*) noexcept override {}

 private:
  template <class T>
  void reduce(const std::vector<std::vector<char>>& all, DLTensor& b, hasten_reduce_op op) const {
    T* out = reinterpret_cast<T*>(data(b));
    const size_t n = size(b) / sizeof(T);
    for (size_t i = 0; i < n; ++i) {
      T acc = reinterpret_cast<const T*>(all[0].data())[i];
      for (int r = 1; r < world_; ++r) {
        const T v = reinterpret_cast<const T*>(all[r].data())[i];
        acc = op == HASTEN_REDUCE_MIN ? std::min(acc, v) : op == HASTEN_REDUCE_MAX ? std::max(acc, v) : acc + v;
      }
      out[i] = op == HASTEN_REDUCE_AVG ? acc / static_cast<T>(world_) : acc;
    }
  }
  static size_t size(const DLTensor& t) {
    size_t n = (t.dtype.bits / 8u) * t.dtype.lanes;
    for (int i = 0; i < t.ndim; ++i) n *= static_cast<size_t>(t.shape[i]);
    return n;
  }
  static char* data(const DLTensor& t) { return static_cast<char*>(t.data) + t.byte_offset; }
  static std::vector<char> bytes(const DLTensor& t) { return {data(t), data(t) + size(t)}; }

  // Publishes this rank's bytes under the next sequence number and reads every rank's.
  std::vector<std::vector<char>> exchange(const std::vector<char>& mine) {
    const std::string key = prefix_ + std::to_string(seq_++) + "/";
    hasten::sdk::check(host(), host()->store_set(host(), (key + std::to_string(rank_)).c_str(), mine.data(), mine.size()),
                       "oot_store: store_set");
    std::vector<std::vector<char>> all(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r) {
      const std::string k = key + std::to_string(r);
      size_t need = 0;
      hasten_status s = host()->store_get(host(), k.c_str(), nullptr, 0, &need, 0);
      if (s != HASTEN_OK && s != HASTEN_ERR_INVALID_ARGUMENT) hasten::sdk::check(host(), s, "oot_store: store_get");
      all[r].resize(need);
      if (need > 0)
        hasten::sdk::check(host(), host()->store_get(host(), k.c_str(), all[r].data(), need, &need, 0),
                           "oot_store: store_get");
    }
    return all;
  }

  int rank_ = 0, world_ = 1;
  std::string prefix_;
  uint64_t seq_ = 0;
};

constexpr hasten_plugin_descriptor kStore =
    hasten::sdk::comm_descriptor<StoreComm>("oot_store", "0.1", "collectives through the rendezvous store");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kStore)
