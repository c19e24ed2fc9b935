// Comm plugin "shm": collectives between the processes of one machine through POSIX shared
// memory, no sockets (the approach of DeepSpeed's CPU shm allreduce and oneCCL). C tier.
//
// Each rank owns a segment: a control block with three completion counters and a staging area
// of two slots of buffer_mb each. Every rank maps every segment, so a rank reads its peers'
// slots directly: every byte crosses shared memory once.
//   allgather: each rank writes its part once into a slot; each copies its own part straight
//     from its input and every peer's part out of that peer's slot.
//   reduce_scatter: each rank stages only the pieces its peers need; each reduces its own slice
//     over its own input (in place, not staged) and the peers' slots, in rank order.
//   broadcast: the root writes a slot, the others copy it out.
//   allreduce (per chunk): 1. each rank copies into slot 0 the slices its peers reduce (not its
//     own); 2. rank r reduces slice r over its own buffer and the peers' slot 0 (in rank order,
//     so the result is the same wherever it is computed) into its slot 1 and its buffer; 3. each
//     rank copies the other slices from their owners' slot 1. Per byte of buffer on 2 ranks:
//     2 bytes read and 2 written (staging the whole chunk took 3 and 2.5).
// Counters are monotonic operation ids: phase 0 says "my slot holds chunk id", phase 1 "my
// reduced slice of chunk id is ready", phase 2 "I have finished reading chunk id and all
// before it". A slot is rewritten only when every peer's phase 2 has passed the chunk it last
// held, so consecutive chunks alternate between the two slots and nothing waits at the end of
// an operation: a writer waits only when a reader is a whole slot behind.
// Waits spin for up to 100 microseconds, then sleep on a futex of the counter (the publisher wakes
// sleepers), so on a machine with more runnable processes than cores a waiting rank gives its
// core to the rank it waits for. They check a deadline and whether the peers are alive, so a
// dead peer is HASTEN_ERR_REMOTE and a hung one HASTEN_ERR_TIMEOUT.
// Operations run on the caller's thread and complete before they return: on one machine the
// latency of a hand-off to another thread is what this plugin exists to avoid.
#include <hasten/plugin.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "buffers.hpp"
#include "group_connect.hpp"
#include "reduce_kernels.hpp"

namespace {

using hasten::comm::data_of;
using hasten::comm::element_size;
using hasten::comm::elements;
using hasten::sdk::Error;
using Clock = std::chrono::steady_clock;

constexpr size_t kLine = 64;
constexpr size_t kControlBytes = 4096;
constexpr int kSpinMicroseconds = 100;        // before a waiting rank sleeps
constexpr long kSleepNanoseconds = 20000000;  // 20 ms: how often a sleeper checks its peer's health

struct alignas(kLine) Counter {
  std::atomic<uint64_t> value;
  char pad[kLine - sizeof(std::atomic<uint64_t>)];
};

struct Control {
  Counter phase[3];
  std::atomic<int32_t> pid;
  uint64_t capacity;  // bytes of each of the two slots
  // Ranks asleep on one of this segment's counters: a publisher makes the wake-up system call
  // only when somebody sleeps.
  alignas(kLine) std::atomic<uint32_t> sleepers;
};
static_assert(sizeof(Control) <= kControlBytes, "control block");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory counters need lock-free atomics");
static_assert(sizeof(std::atomic<uint64_t>) == 8, "a counter is one 64-bit word");

// The futex word of a counter: its low 32 bits (ids change there first).
uint32_t* futex_word(const std::atomic<uint64_t>& counter) {
  auto* words = reinterpret_cast<uint32_t*>(const_cast<std::atomic<uint64_t>*>(&counter));
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  return words;
#else
  return words + 1;
#endif
}

// Not FUTEX_PRIVATE: the word lives in memory shared between processes.
void futex_sleep(const std::atomic<uint64_t>& counter, uint32_t seen, long nanoseconds) {
  const timespec ts{0, nanoseconds};
  ::syscall(SYS_futex, futex_word(counter), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake_all(const std::atomic<uint64_t>& counter) {
  ::syscall(SYS_futex, futex_word(counter), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

struct Segment {
  void* base = nullptr;
  size_t size = 0;
  Control* control() const { return static_cast<Control*>(base); }
  char* slot(int s) const { return static_cast<char*>(base) + kControlBytes + static_cast<size_t>(s) * control()->capacity; }
};

// Segment names: kNamePrefix, the creator's PID namespace (the inode of /proc/self/ns/pid), "-",
// its pid, "-", the run's token (16 hex digits), "-", the rank. The pid lets a later run tell
// a segment whose creator died before unlinking it (killed during set-up) from one a live run
// still sets up; the namespace keeps a run in another container sharing /dev/shm, whose pids
// mean other processes, from reclaiming ours (and us theirs).
constexpr const char* kNamePrefix = "hasten-shm-";

std::string pid_namespace() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return "0";
  return std::to_string(static_cast<unsigned long long>(st.st_ino));
}

// Whether name (without the leading '/') is hasten-shm-NS-PID-TOKEN-RANK; sets pid.
bool parse_name(const std::string& name, std::string* ns, long* pid, std::string* token, int* rank) {
  const size_t prefix_len = std::strlen(kNamePrefix);
  if (name.compare(0, prefix_len, kNamePrefix) != 0) return false;
  std::vector<std::string> parts;
  for (size_t at = prefix_len;;) {
    const size_t dash = name.find('-', at);
    parts.push_back(name.substr(at, dash == std::string::npos ? std::string::npos : dash - at));
    if (dash == std::string::npos) break;
    at = dash + 1;
  }
  auto digits = [](const std::string& t) {
    return !t.empty() && t.size() <= 20 && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (parts.size() != 4 || !digits(parts[0]) || !digits(parts[1]) || !digits(parts[3]) || parts[2].size() != 16 ||
      !std::all_of(parts[2].begin(), parts[2].end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
    return false;
  *ns = parts[0];
  *pid = std::strtol(parts[1].c_str(), nullptr, 10);
  *token = parts[2];
  *rank = static_cast<int>(std::strtol(parts[3].c_str(), nullptr, 10));
  return *pid > 0;
}

// Unlinks the segments in /dev/shm of this PID namespace whose creator no longer exists and
// that belong to this user: nothing another user or another container made is touched.
void reclaim_orphans() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;  // no /dev/shm to scan: nothing can have leaked there
  const std::string my_ns = pid_namespace();
  std::vector<std::string> dead;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    std::string ns, token;
    long pid = 0;
    int rank = 0;
    if (!parse_name(name, &ns, &pid, &token, &rank) || ns != my_ns) continue;
    struct stat st {};
    if (::fstatat(::dirfd(dir), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != ::geteuid())
      continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) dead.push_back("/" + name);
  }
  ::closedir(dir);
  for (const auto& name : dead) ::shm_unlink(name.c_str());
}

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Copies a piece of a rank's own data to two places in one pass over the source.
void copy_twice(char* a, char* b, const char* src, size_t bytes) {
  constexpr size_t kStep = 64 * 1024;  // stays in L1/L2 between the two writes
  for (size_t at = 0; at < bytes; at += kStep) {
    const size_t n = std::min(kStep, bytes - at);
    std::memcpy(a + at, src + at, n);
    if (b + at != src + at) std::memcpy(b + at, a + at, n);
  }
}

class ShmComm final : public hasten::sdk::Comm {
 public:
  // CPU buffers of ranks on one machine; preferred to gloo there (memory, not sockets).
  static constexpr int32_t kDevices[] = {kDLCPU};
  static constexpr hasten_comm_serves serves = hasten::sdk::comm_serves(kDevices, HASTEN_COMM_SCOPE_ONE_MACHINE, 20);

  ShmComm(const hasten_host_api* host, std::string_view options) : Comm(host), options_(options) {
    const hasten::sdk::Options o(host, options, "shm", {"buffer_mb"});
    if (const auto mb = o.number("buffer_mb")) {
      if (!(*mb >= 1 && *mb <= 4096))
        throw Error(HASTEN_ERR_INVALID_ARGUMENT, "shm options: buffer_mb must be 1 to 4096, got " + std::to_string(*mb));
      capacity_ = static_cast<size_t>(*mb * 1024 * 1024) / kLine * kLine;
    }
  }

  ~ShmComm() override {
    for (auto& s : segments_)
      if (s.base != nullptr) ::munmap(s.base, s.size);
    if (!my_name_.empty() && !unlinked_) ::shm_unlink(my_name_.c_str());
  }

  // ABI 1.11: a group is a communicator of its own among its members (group_connect.hpp).
  Comm* split(const hasten_comm_split& split) override {
    return hasten::comm::connect_group<ShmComm>(host(), options_, init_, split);
  }

  void init(const hasten_comm_init& init) override {
    init_ = init;
    init_.store_prefix = nullptr;  // borrowed for the call only
    rank_ = init.rank;
    world_ = init.world_size;
    timeout_ = std::chrono::milliseconds(init.timeout_ms > 0 ? init.timeout_ms : 1800000);
    connect_timeout_ = init.connect_timeout_ms > 0 ? std::chrono::milliseconds(init.connect_timeout_ms) : timeout_;
    prefix_ = init.store_prefix ? init.store_prefix : "shm/";
    const auto info = hasten::sdk::process_info(host());
    if (info.num_nodes > 1)
      throw Error(HASTEN_ERR_UNSUPPORTED, "shm: the run spans " + std::to_string(info.num_nodes) +
                                              " machines; shared memory connects the ranks of one machine (use gloo)");
    reclaim_orphans();
    // Rank 0 draws the run's token; each rank creates its own segment, publishes its name,
    // then maps everyone's.
    std::string token;
    if (rank_ == 0) {
      std::random_device rd;  // the kernel's random source on Linux
      char hex[17];
      std::snprintf(hex, sizeof hex, "%08x%08x", rd(), rd());
      token = hex;
      store_set("token", token);
    } else {
      token = store_get("token");
    }
    my_name_ = "/" + std::string(kNamePrefix) + pid_namespace() + "-" + std::to_string(::getpid()) + "-" + token + "-" +
               std::to_string(rank_);
    const size_t size = kControlBytes + 2 * capacity_;
    const int fd = ::shm_open(my_name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      const std::string name = my_name_;
      my_name_.clear();  // not ours: the destructor must not unlink it
      throw Error(HASTEN_ERR_SYSTEM, "shm: cannot create " + name + ": " + std::strerror(errno));
    }
    try {
      connect(fd, size, token);
    } catch (...) {
      // Every failure after the segment exists removes it here, whether or not the host
      // destroys this instance afterwards.
      ::shm_unlink(my_name_.c_str());
      unlinked_ = true;
      throw;
    }
  }

 private:
  // The rest of init, once this rank's segment exists: size it, map every rank's.
  void connect(int fd, size_t size, const std::string& token) {
    // Reserve the pages now: a tmpfs that is too small then fails here with a message, not
    // with SIGBUS at the first large collective.
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0 || ::posix_fallocate(fd, 0, static_cast<off_t>(size)) != 0) {
      const int err = errno;
      ::close(fd);
      ::shm_unlink(my_name_.c_str());
      throw Error(HASTEN_ERR_SYSTEM, "shm: cannot reserve " + std::to_string(size >> 20) + " MiB in /dev/shm for rank " +
                                         std::to_string(rank_) + " (" + std::strerror(err) +
                                         "); lower comm_options.buffer_mb or use comm: gloo");
    }
    segments_.resize(static_cast<size_t>(world_));
    segments_[static_cast<size_t>(rank_)] = map(fd, size, my_name_);
    Control* mine = segments_[static_cast<size_t>(rank_)].control();
    for (auto& c : mine->phase) c.value.store(0, std::memory_order_relaxed);
    mine->sleepers.store(0, std::memory_order_relaxed);
    mine->capacity = capacity_;
    mine->pid.store(::getpid(), std::memory_order_release);
    store_set("segment/" + std::to_string(rank_), my_name_);
    arrive("created");
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      const std::string name = store_get("segment/" + std::to_string(q));
      // Exactly the name rank q makes: this run's token and q's rank.
      std::string ns, their_token;
      long pid = 0;
      int their_rank = -1;
      if (name.empty() || name[0] != '/' || !parse_name(name.substr(1), &ns, &pid, &their_token, &their_rank) ||
          their_token != token || their_rank != q)
        throw Error(HASTEN_ERR_INVALID_USAGE, "shm: rank " + std::to_string(q) + " published a segment name that is "
                                                  "not one of this run's (" + std::to_string(name.size()) + " bytes)");
      const int pfd = ::shm_open(name.c_str(), O_RDWR, 0600);
      if (pfd < 0)
        throw Error(HASTEN_ERR_SYSTEM, "shm: rank " + std::to_string(rank_) + " cannot open rank " + std::to_string(q) +
                                           "'s segment " + name + " (are all ranks on one machine?): " + std::strerror(errno));
      // Made by this user, readable by nobody else, of the size every rank makes: a segment
      // another local user planted under the name is not mapped.
      struct stat st {};
      if (::fstat(pfd, &st) != 0 || st.st_uid != ::geteuid() || (st.st_mode & 0777) != 0600 ||
          static_cast<uint64_t>(st.st_size) != size) {
        ::close(pfd);
        char mode[8];
        std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 0777));
        throw Error(HASTEN_ERR_INVALID_USAGE,
                    "shm: rank " + std::to_string(q) + "'s segment " + name + " is not what a rank of this run makes "
                    "(owner uid " + std::to_string(st.st_uid) + ", mode " + mode + ", " + std::to_string(st.st_size) +
                    " bytes; expected this user, 0600, " + std::to_string(size) + " bytes: the same buffer_mb on every rank)");
      }
      segments_[static_cast<size_t>(q)] = map(pfd, size, name);
      if (segments_[static_cast<size_t>(q)].control()->capacity != capacity_)
        throw Error(HASTEN_ERR_INVALID_ARGUMENT, "shm: ranks disagree on buffer_mb");
    }
    arrive("mapped");
    ::shm_unlink(my_name_.c_str());  // everyone has it mapped: the memory goes when the last rank exits
    unlinked_ = true;
  }

 public:

  bool supports_device(int32_t device_type) override { return device_type == kDLCPU; }

  hasten_work* allreduce(DLTensor& buffer, hasten_reduce_op op, const hasten_coll_options* o) override {
    hasten::comm::require_cpu_compact(buffer, "shm", "allreduce");
    const auto kernel = hasten::comm::reduce_kernel(buffer.dtype, op);
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t es = element_size(buffer), n = elements(buffer);
    if (world_ == 1) {
      if (op == HASTEN_REDUCE_AVG) hasten::comm::divide(data_of(buffer), n, buffer.dtype, 1);
      return nullptr;
    }
    const auto deadline = Clock::now() + timeout_of(o);
    const size_t per_chunk = capacity_ / es;
    char* buf = data_of(buffer);
    // Both slots are rewritten: every peer must be done with what they last held. Within the
    // loop, a peer that published phase 0 of chunk k has finished reading chunk k-1.
    wait_all(2, std::max(slot_last_[0], slot_last_[1]), deadline, "allreduce");
    auto slice = [&](size_t count, size_t q) {  // [lo, hi) of rank q's slice of a chunk
      return std::pair<size_t, size_t>{count * q / static_cast<size_t>(world_), count * (q + 1) / static_cast<size_t>(world_)};
    };
    const size_t r = static_cast<size_t>(rank_);
    std::vector<const char*> sources(static_cast<size_t>(world_));
    for (size_t start = 0; start < n; start += per_chunk) {
      const size_t count = std::min(per_chunk, n - start);
      const uint64_t id = ++op_;
      char* chunk = buf + start * es;
      // Stage only the slices the peers reduce; my own slice is reduced from my buffer.
      for (size_t q = 0; q < static_cast<size_t>(world_); ++q) {
        const auto [qlo, qhi] = slice(count, q);
        if (q != r && qhi > qlo) std::memcpy(me().slot(0) + qlo * es, chunk + qlo * es, (qhi - qlo) * es);
      }
      publish(0, id);
      wait_all(0, id, deadline, "allreduce");
      // My slice, reduced over every rank in rank order (so the result is the same wherever it
      // is computed) into my slot 1 for the peers, a cache-sized block at a time, each block
      // copied into my buffer while it is still in cache.
      const auto [lo, hi] = slice(count, r);
      const size_t block = 64 * 1024 / es;
      for (size_t at = lo; at < hi; at += block) {
        const size_t len = std::min(block, hi - at);
        for (size_t q = 0; q < static_cast<size_t>(world_); ++q)
          sources[q] = q == r ? chunk + at * es : segments_[q].slot(0) + at * es;
        char* out = me().slot(1) + at * es;
        kernel(out, sources[0], sources[1], len);
        for (size_t q = 2; q < static_cast<size_t>(world_); ++q) kernel(out, out, sources[q], len);
        if (op == HASTEN_REDUCE_AVG) hasten::comm::divide(out, len, buffer.dtype, world_);
        std::memcpy(chunk + at * es, out, len * es);
      }
      publish(1, id);
      // The peers' slices, each from its owner's slot 1 once the owner has reduced it.
      for (int k = 1; k < world_; ++k) {
        const size_t q = static_cast<size_t>((rank_ + k) % world_);
        const auto [qlo, qhi] = slice(count, q);
        wait_one(q, 1, id, deadline, "allreduce");
        if (qhi > qlo) std::memcpy(chunk + qlo * es, segments_[q].slot(1) + qlo * es, (qhi - qlo) * es);
      }
      publish(2, id);
      slot_last_[0] = slot_last_[1] = id;
    }
    return nullptr;
  }

  hasten_work* allgather(const DLTensor& input, DLTensor& output, const hasten_coll_options* o) override {
    hasten::comm::require_cpu_compact(input, "shm", "allgather");
    hasten::comm::require_cpu_compact(output, "shm", "allgather");
    const size_t bytes = elements(input) * element_size(input);
    if (elements(output) * element_size(output) != bytes * static_cast<size_t>(world_))
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "shm allgather: output must hold world_size x input bytes");
    std::lock_guard<std::mutex> lock(mutex_);
    const auto deadline = Clock::now() + timeout_of(o);
    const char* in = data_of(input);
    char* out = data_of(output);
    if (world_ == 1) {
      if (out != in) std::memmove(out, in, bytes);
      return nullptr;
    }
    char* mine = out + static_cast<size_t>(rank_) * bytes;
    for (size_t start = 0; start < bytes; start += capacity_) {
      const size_t count = std::min(capacity_, bytes - start);
      const uint64_t id = ++op_;
      const int s = claim_slot(id, deadline, "allgather");
      // My part: into my slot for the peers and into my output, in one pass over the input.
      copy_twice(me().slot(s), mine + start, in + start, count);
      publish(0, id);
      // The peers' parts, starting with the next rank so that not everyone reads rank 0 first.
      for (int k = 1; k < world_; ++k) {
        const size_t q = static_cast<size_t>((rank_ + k) % world_);
        wait_one(q, 0, id, deadline, "allgather");
        std::memcpy(out + q * bytes + start, segments_[q].slot(s), count);
      }
      publish(2, id);
    }
    return nullptr;
  }

  hasten_work* reduce_scatter(const DLTensor& input, DLTensor& output, hasten_reduce_op op,
                              const hasten_coll_options* o) override {
    hasten::comm::require_cpu_compact(input, "shm", "reduce_scatter");
    hasten::comm::require_cpu_compact(output, "shm", "reduce_scatter");
    const auto kernel = hasten::comm::reduce_kernel(input.dtype, op);
    const size_t es = element_size(input), n = elements(input), m = elements(output);
    if (m * static_cast<size_t>(world_) != n)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "shm reduce_scatter: input must hold world_size x output elements");
    std::lock_guard<std::mutex> lock(mutex_);
    const auto deadline = Clock::now() + timeout_of(o);
    const char* in = data_of(input);
    char* out = data_of(output);
    if (world_ == 1) {
      std::memmove(out, in, n * es);
      if (op == HASTEN_REDUCE_AVG) hasten::comm::divide(out, m, input.dtype, 1);
      return nullptr;
    }
    // A slot holds, per chunk, the world_size - 1 pieces this rank's peers reduce (rank q's
    // piece at position q, or q - 1 past this rank); this rank's own piece is never staged.
    const size_t pieces = static_cast<size_t>(world_ - 1);
    const size_t per_chunk = capacity_ / es / pieces;
    auto position = [](size_t q, size_t owner) { return q < owner ? q : q - 1; };
    const size_t r = static_cast<size_t>(rank_);
    std::vector<const char*> sources(static_cast<size_t>(world_));
    for (size_t start = 0; start < m; start += per_chunk) {
      const size_t count = std::min(per_chunk, m - start);
      const uint64_t id = ++op_;
      const int s = claim_slot(id, deadline, "reduce_scatter");
      for (size_t q = 0; q < static_cast<size_t>(world_); ++q)
        if (q != r) std::memcpy(me().slot(s) + position(q, r) * count * es, in + (q * m + start) * es, count * es);
      publish(0, id);
      for (size_t q = 0; q < static_cast<size_t>(world_); ++q) {
        if (q == r) {
          sources[q] = in + (r * m + start) * es;
        } else {
          wait_one(q, 0, id, deadline, "reduce_scatter");
          sources[q] = segments_[q].slot(s) + position(r, q) * count * es;
        }
      }
      char* dst = out + start * es;
      kernel(dst, sources[0], sources[1], count);
      for (size_t q = 2; q < static_cast<size_t>(world_); ++q) kernel(dst, dst, sources[q], count);
      if (op == HASTEN_REDUCE_AVG) hasten::comm::divide(dst, count, input.dtype, world_);
      publish(2, id);
    }
    return nullptr;
  }

  hasten_work* broadcast(DLTensor& buffer, int32_t root, const hasten_coll_options* o) override {
    hasten::comm::require_cpu_compact(buffer, "shm", "broadcast");
    if (root < 0 || root >= world_)
      throw Error(HASTEN_ERR_INVALID_ARGUMENT, "shm broadcast: root " + std::to_string(root) + " outside [0, " +
                                                   std::to_string(world_) + ")");
    std::lock_guard<std::mutex> lock(mutex_);
    if (world_ == 1) return nullptr;
    const auto deadline = Clock::now() + timeout_of(o);
    const size_t bytes = elements(buffer) * element_size(buffer);
    char* buf = data_of(buffer);
    for (size_t start = 0; start < bytes; start += capacity_) {
      const size_t count = std::min(capacity_, bytes - start);
      const uint64_t id = ++op_;
      const int s = claim_slot(id, deadline, "broadcast");
      if (rank_ == root) {
        std::memcpy(me().slot(s), buf + start, count);
        publish(0, id);
      } else {
        wait_one(static_cast<size_t>(root), 0, id, deadline, "broadcast");
        std::memcpy(buf + start, segments_[static_cast<size_t>(root)].slot(s), count);
      }
      publish(2, id);
    }
    return nullptr;
  }

  hasten_work* barrier(const hasten_coll_options* o) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (world_ == 1) return nullptr;
    const auto deadline = Clock::now() + timeout_of(o);
    const uint64_t id = ++op_;
    publish(0, id);
    wait_all(0, id, deadline, "barrier");
    publish(2, id);
    return nullptr;
  }

  // Every operation completes before it returns (work handles are always NULL).
  void wait(hasten_work*, int64_t) override {}
  bool test(hasten_work*) override { return true; }
  void free_work(hasten_work*) noexcept override {}

 private:
  Segment map(int fd, size_t size, const std::string& name) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw Error(HASTEN_ERR_SYSTEM, "shm: cannot map " + name + ": " + std::strerror(errno));
    return {p, size};
  }

  const Segment& me() const { return segments_[static_cast<size_t>(rank_)]; }

  std::chrono::milliseconds timeout_of(const hasten_coll_options* o) const {
    return o != nullptr && o->timeout_ms > 0 ? std::chrono::milliseconds(o->timeout_ms) : timeout_;
  }

  void publish(int phase, uint64_t id) {
    Control* c = me().control();
    c->phase[phase].value.store(id, std::memory_order_seq_cst);
    // Pairs with the sleeper's increment and re-check in wait_one: either it sees the new id,
    // or this load sees it counted and wakes it.
    if (c->sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(c->phase[phase].value);
  }

  // The slot of chunk `id` (they alternate), once every peer has finished reading the chunk
  // it last held.
  int claim_slot(uint64_t id, Clock::time_point deadline, const char* op) {
    const int s = static_cast<int>(id & 1);
    wait_all(2, slot_last_[s], deadline, op);
    slot_last_[s] = id;
    return s;
  }

  void wait_one(size_t q, int phase, uint64_t id, Clock::time_point deadline, const char* op) {
    Control* c = segments_[q].control();
    const auto& counter = c->phase[phase].value;
    if (counter.load(std::memory_order_acquire) >= id) return;
    // Spin a while: a peer that is running usually publishes within that, and a sleeper pays
    // the scheduler's wake-up latency (milliseconds when other processes hold the cores).
    const auto spin_until = Clock::now() + std::chrono::microseconds(kSpinMicroseconds);
    for (uint32_t spins = 1;; ++spins) {
      if (counter.load(std::memory_order_acquire) >= id) return;
      cpu_relax();
      if ((spins & 63) == 0 && Clock::now() > spin_until) break;
    }
    // Then sleep until the peer publishes, looking at its health every sleep period.
    for (;;) {
      c->sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint64_t seen = counter.load(std::memory_order_seq_cst);
      if (seen < id) futex_sleep(counter, static_cast<uint32_t>(seen), kSleepNanoseconds);
      c->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      if (counter.load(std::memory_order_acquire) >= id) return;
      // A peer that published its last phase and then exited is not a failure: look again
      // after learning it is gone, or the end of a run races with its last collective.
      if (::kill(c->pid.load(std::memory_order_relaxed), 0) != 0 && errno == ESRCH &&
          counter.load(std::memory_order_acquire) < id)
        throw Error(HASTEN_ERR_REMOTE, "shm: rank " + std::to_string(q) + " (pid " + std::to_string(c->pid.load()) +
                                           ") died during " + op + " (rank " + std::to_string(rank_) + " was waiting)");
      if (Clock::now() > deadline)
        throw Error(HASTEN_ERR_TIMEOUT, "shm: " + std::string(op) + " timed out on rank " + std::to_string(rank_) +
                                            ": rank " + std::to_string(q) + " did not arrive (hung or gone)");
    }
  }

  void wait_all(int phase, uint64_t id, Clock::time_point deadline, const char* op) {
    if (id == 0) return;
    for (size_t q = 0; q < segments_.size(); ++q)
      if (static_cast<int>(q) != rank_) wait_one(q, phase, id, deadline, op);
  }

  // Store helpers for the set-up.
  void store_set(const std::string& key, const std::string& value) {
    const std::string k = prefix_ + key;
    hasten::sdk::check(host(), host()->store_set(host(), k.c_str(), value.data(), value.size()), "shm rendezvous");
  }
  std::string store_get(const std::string& key) {
    const std::string k = prefix_ + key;
    char buf[512];
    size_t size = 0;
    hasten::sdk::check(host(), host()->store_get(host(), k.c_str(), buf, sizeof buf, &size, connect_timeout_.count()),
                       "shm rendezvous");
    return std::string(buf, size);
  }
  // Counts this rank in and waits until every rank has.
  void arrive(const std::string& key) {
    const std::string k = prefix_ + key;
    int64_t n = 0;
    hasten::sdk::check(host(), host()->store_add(host(), k.c_str(), 1, &n), "shm rendezvous");
    const auto deadline = Clock::now() + connect_timeout_;
    while (n < world_) {
      if (Clock::now() > deadline)
        throw Error(HASTEN_ERR_TIMEOUT, "shm: set-up timed out waiting for the other ranks (" + key + ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      hasten::sdk::check(host(), host()->store_add(host(), k.c_str(), 0, &n), "shm rendezvous");
    }
  }

  std::string options_;  // as create() received them: a group's instance gets the same
  hasten_comm_init init_{};
  size_t capacity_ = 16u << 20;
  int rank_ = 0, world_ = 1;
  std::chrono::milliseconds timeout_{1800000};
  std::chrono::milliseconds connect_timeout_{1800000};  // set-up: store waits for the other ranks
  std::string prefix_;
  std::string my_name_;
  bool unlinked_ = false;
  std::vector<Segment> segments_;
  uint64_t op_ = 0;
  uint64_t slot_last_[2] = {0, 0};  // the last chunk id each of my slots held
  std::mutex mutex_;
};

constexpr hasten_plugin_descriptor kShm = hasten::sdk::comm_descriptor<ShmComm>(
    "shm", "1.0", "CPU collectives through POSIX shared memory, ranks of one machine");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kShm)
