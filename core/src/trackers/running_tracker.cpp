// Trackers in this process or in a host process of their own (running_tracker.hpp). The
// isolated kind sends log calls without waiting for an answer (one send() per call); the host
// answers only create, start and finish, or says that the tracker failed, or (from its signal
// handler) in which call it crashed. A dead host is noticed at the next call, or at the end.
// Boost.DLL on std::filesystem, as in registry.cpp (no Boost.Filesystem library to link).
#define BOOST_DLL_USE_STD_FS 1
#include "trackers/running_tracker.hpp"

#include <hasten/logging.hpp>

#include <boost/dll/runtime_symbol_info.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "plugins/plugin_instances.hpp"
#include "trackers/tracker_instance.hpp"
#include "trackers/tracker_wire.hpp"

namespace hasten::detail {

namespace {

namespace fs = std::filesystem;
using wire::Clock;
using wire::Io;
using wire::Msg;

// How long the training process waits for a tracker host: to answer create, start and
// finish, to read a log call when its socket is full, and to exit after finish or after the
// training process closed its end. A host past one of these is killed and reported.
constexpr auto kReplyWait = std::chrono::seconds(60);
constexpr auto kExitWait = std::chrono::seconds(30);

class InProcessTracker final : public RunningTracker {
 public:
  InProcessTracker(const PluginSelection& selection, const hasten_host_api* host, const std::string& options)
      : t_(selection, host, options) {}
  const std::string& name() const override { return t_.name(); }
  void start(const std::string& project, const std::string& dir, const std::string& hparams, int rank) override {
    t_.start(project, dir, hparams, rank);
  }
  void log_scalars(const std::vector<std::pair<std::string, double>>& values, int64_t step) override {
    t_.log_scalars(values, step);
  }
  void log_text(const std::string& name, const std::string& text, int64_t step) override {
    t_.log_text(name, text, step);
  }
  int32_t keeps() const override { return const_cast<TrackerInstance&>(t_).keeps(); }
  void log_image(const std::string& name, const std::vector<uint8_t>& pixels, uint32_t h, uint32_t w, uint32_t c,
                 int64_t step) override {
    t_.log_image(name, pixels, h, w, c, step);
  }
  void log_histogram(const std::string& name, const std::vector<double>& values, int64_t step) override {
    t_.log_histogram(name, values, step);
  }
  void log_table(const std::string& name, const std::string& table_json, int64_t step) override {
    t_.log_table(name, table_json, step);
  }
  std::string run_info() override { return t_.run_info(); }
  void end(hasten_status status) override {
    t_.flush();
    t_.finish(status);
  }

 private:
  TrackerInstance t_;
};

// "died of SIGSEGV (Segmentation fault)", "exited with status 3"
std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = ::sigabbrev_np(sig);
    const char* text = ::strsignal(sig);
    return "died of " + (abbrev ? "SIG" + std::string(abbrev) : "signal " + std::to_string(sig)) +
           (text ? " (" + std::string(text) + ")" : std::string());
  }
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "ended (wait status " + std::to_string(status) + ")";
}

class IsolatedTracker final : public RunningTracker {
 public:
  IsolatedTracker(const PluginSelection& selection, const std::string& options, const ProcessInfo& p,
                  const std::string& log_level)
      : name_(selection.info->name), label_(plugin_label(selection)) {
    spawn();
    wire::Writer w(Msg::Create);
    std::error_code ec;
    const std::string program = fs::read_symlink("/proc/self/exe", ec).string();
    w.str(selection.info->file).str(selection.info->name).str(options).str(log_level).str(program);
    w.i32(p.rank).i32(p.world_size).i32(p.local_rank).i32(p.local_world_size).i32(p.node_rank).i32(p.num_nodes);
    send(w, "create");
  }

  void wait_created() override {
    wire::Reader created = reply("create", Msg::Created);
    // A host of this build says what the tracker keeps; one without the field keeps scalars only.
    keeps_ = created.remaining() >= sizeof(int32_t) ? created.i32() : 0;
  }

  ~IsolatedTracker() override {
    if (pid_ <= 0) return;
    // The run did not reach end_training (or the tracker failed on the way): closing our end
    // tells the host to destroy the tracker without finish(), which it records as a failed run.
    ::shutdown(fd_, SHUT_WR);
    try {
      const std::string how = wait_exit();
      if (!how.empty()) get_logger()->warn("tracker '{}' failed at the end of the run: {}: its host process {}", name_, label_, how);
    } catch (...) {  // a destructor reports, never throws
    }
  }

  const std::string& name() const override { return name_; }

  void start(const std::string& project, const std::string& dir, const std::string& hparams, int rank) override {
    wire::Writer w(Msg::Start);
    w.str(project).str(dir).str(hparams).i32(rank);
    request(w, "start", Msg::Started);
  }

  void log_scalars(const std::vector<std::pair<std::string, double>>& values, int64_t step) override {
    wire::Writer w(Msg::Scalars);
    w.i64(step).i32(static_cast<int32_t>(values.size()));
    for (auto& [name, value] : values) w.str(name).f64(value);
    post(w, "log_scalars");
  }

  void log_text(const std::string& name, const std::string& text, int64_t step) override {
    wire::Writer w(Msg::Text);
    w.i64(step).str(name).str(text);
    post(w, "log_text");
  }

  int32_t keeps() const override { return keeps_; }

  void log_image(const std::string& name, const std::vector<uint8_t>& pixels, uint32_t h, uint32_t w, uint32_t c,
                 int64_t step) override {
    wire::Writer m(Msg::Image);
    m.i64(step).str(name).i32(static_cast<int32_t>(h)).i32(static_cast<int32_t>(w)).i32(static_cast<int32_t>(c));
    m.str(reinterpret_cast<const char*>(pixels.data()), pixels.size());
    post(m, "log_image");
  }

  void log_histogram(const std::string& name, const std::vector<double>& values, int64_t step) override {
    wire::Writer m(Msg::Histogram);
    m.i64(step).str(name).str(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
    post(m, "log_histogram");
  }

  void log_table(const std::string& name, const std::string& table_json, int64_t step) override {
    wire::Writer m(Msg::Table);
    m.i64(step).str(name).str(table_json);
    post(m, "log_table");
  }

  std::string run_info() override {
    wire::Writer w(Msg::RunInfo);
    return request(w, "run_info", Msg::Info).str();
  }

  void end(hasten_status status) override {
    wire::Writer w(Msg::Finish);
    w.i32(static_cast<int32_t>(status));
    request(w, "finish", Msg::Finished);
    ::shutdown(fd_, SHUT_WR);
    const std::string how = wait_exit();  // destroy() runs after Finished
    if (!how.empty()) throw TrackerDied(label_ + ": its host process " + how);
  }

 private:
  void spawn() {
    const std::string program = tracker_host_program();
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      throw TrackerDied(label_ + ": cannot create the socket of its host process: " + std::strerror(errno));
    fd_ = sv[0];
    int child_end = sv[1];
    if (child_end == wire::kHostFd) {  // dup2 onto itself would keep close-on-exec set
      child_end = ::fcntl(sv[1], F_DUPFD_CLOEXEC, wire::kHostFd + 1);
      ::close(sv[1]);
    }
    // posix_spawn, not fork: this process runs LibTorch's threads, and a forked copy of it
    // may only call async-signal-safe functions until it execs.
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_adddup2(&actions, child_end, wire::kHostFd);
    std::string arg0 = program;
    char* argv[] = {&arg0[0], nullptr};
    const int rc = ::posix_spawn(&pid_, program.c_str(), &actions, nullptr, argv, environ);
    ::posix_spawn_file_actions_destroy(&actions);
    ::close(child_end);
    if (rc != 0) {
      pid_ = -1;
      throw TrackerDied(label_ + ": cannot start its host process " + program + ": " + std::strerror(rc));
    }
  }

  // A log call: sent without waiting, after collecting what the host said meanwhile.
  void post(wire::Writer& w, const char* stage) {
    if (wire::wait_ready(fd_, POLLIN, Clock::now()) == Io::Done) reply(stage, Msg::Failed);
    send(w, stage);
  }

  wire::Reader request(wire::Writer& w, const char* stage, Msg expected) {
    send(w, stage);
    return reply(stage, expected);
  }

  void send(wire::Writer& w, const char* stage) {
    const Io r = wire::send_all(fd_, w.frame(), Clock::now() + kReplyWait);
    if (r == Io::Timeout) stalled(stage);
    if (r == Io::Closed) gone(stage);
  }

  // Reads one answer (returned, its type read); anything but `expected` ends the tracker with
  // the reason.
  wire::Reader reply(const char* stage, Msg expected) {
    std::string body;
    const Io r = wire::read_frame(fd_, body, Clock::now() + kReplyWait);
    if (r == Io::Timeout) stalled(stage);
    if (r == Io::Closed) gone(stage);
    wire::Reader in(std::move(body));
    const Msg type = in.type();
    if (type == expected && type != Msg::Failed) return in;
    if (type == Msg::Failed) {
      in.str();  // the stage: the message names it already
      const std::string message = in.str();
      ::shutdown(fd_, SHUT_WR);
      wait_exit();
      throw PluginError(message);  // the plugin's own error, as in-process
    }
    if (type == Msg::Crashed) crashed_in_ = in.str();
    gone(stage);
  }

  [[noreturn]] void gone(const char* stage) {
    ::shutdown(fd_, SHUT_WR);
    const std::string how = wait_exit();
    throw TrackerDied(label_ + ": its host process " + (how.empty() ? "closed its socket" : how) +
                      (crashed_in_.empty() ? std::string(" (noticed at ") + stage + ")" : std::string()));
  }

  [[noreturn]] void stalled(const char* stage) {
    ::kill(pid_, SIGKILL);
    wait_exit();
    throw TrackerDied(label_ + ": its host process did not take " + stage + " within " +
                      std::to_string(kReplyWait.count()) + " s and was stopped");
  }

  // Reads what the host still says (its crash report) until it closes, waits for it to exit
  // (killing it past kExitWait) and says how it ended ("died of SIGSEGV (Segmentation
  // fault) in log_scalars"); "" for a clean exit.
  std::string wait_exit() {
    if (pid_ <= 0) return "";
    const auto deadline = Clock::now() + kExitWait;
    std::string body;
    while (wire::read_frame(fd_, body, deadline) == Io::Done) {
      wire::Reader in(body);
      if (in.type() == Msg::Crashed) crashed_in_ = in.str();
    }
    int status = 0;
    bool killed = false;
    for (;;) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno != EINTR)) break;
      if (Clock::now() >= deadline && !killed) {
        ::kill(pid_, SIGKILL);
        killed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(killed ? 1 : 5));
    }
    pid_ = -1;
    ::close(fd_);
    fd_ = -1;
    if (killed) return "did not exit within " + std::to_string(kExitWait.count()) + " s and was stopped";
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
    std::string how = describe_exit(status);
    if (!crashed_in_.empty()) how += " in " + crashed_in_;
    return how;
  }

  std::string name_;
  std::string label_;
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string crashed_in_;  // the call the host's signal handler reported
  int32_t keeps_ = 0;       // what the host said the tracker keeps, at create
};

}  // namespace

std::unique_ptr<RunningTracker> make_in_process_tracker(const PluginSelection& selection, const hasten_host_api* host,
                                                        const std::string& options_json) {
  return std::make_unique<InProcessTracker>(selection, host, options_json);
}

std::unique_ptr<RunningTracker> make_isolated_tracker(const PluginSelection& selection, const std::string& options_json,
                                                      const ProcessInfo& process, const std::string& log_level) {
  // The options are merged with the preset and checked here, so that a described option's
  // error reads the same in both modes and the host only has to hand them on.
  return std::make_unique<IsolatedTracker>(selection, plugin_options(selection, options_json), process, log_level);
}

std::string tracker_host_program() {
  // libhasten's own directory: build/lib in the build tree (the program is in build/bin),
  // <prefix>/<libdir> when installed (the program is in <prefix>/<libexecdir>/hasten).
  fs::path libdir;
  try {
    libdir = boost::dll::this_line_location().parent_path();
  } catch (const std::exception&) {
  }
  std::vector<fs::path> candidates = {libdir / HASTEN_TRACKER_HOST_FROM_LIBDIR / "hasten-tracker-host",
                                      libdir / ".." / "bin" / "hasten-tracker-host"};
  for (auto& c : candidates) {
    c = c.lexically_normal();
    if (::access(c.c_str(), X_OK) == 0) return c.string();
  }
  throw PluginError("trackers: the tracker host program is missing (looked for " + candidates[0].string() + " and " +
                    candidates[1].string() +
                    "); reinstall hasten, or set trackers_in_process: true to run trackers inside the training process");
}

}  // namespace hasten::detail
