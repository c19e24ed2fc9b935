// hasten-tracker-host: runs one tracker plugin for a training process, which started it with
// its end of a socket on fd 3 (running_tracker.cpp; messages in tracker_wire.hpp). A tracker
// that crashes here takes only this process down; the signal handler first tells the
// training process in which call it happened. Not a user command: it has no flags.
#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/registry.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "plugins/host_api.hpp"
#include "trackers/tracker_instance.hpp"
#include "trackers/tracker_wire.hpp"

namespace {

using namespace hasten;
using namespace hasten::detail;
using wire::Msg;

// The call in progress, for the crash handler: one prepared Crashed frame per call, so the
// handler only write()s (async-signal-safe).
enum Stage {
  kCreate, kStart, kLogScalars, kLogText, kLogImage, kLogHistogram, kLogTable, kRunInfo, kFlush, kFinish, kDestroy, kStages
};
const char* const kStageNames[kStages] = {"create",    "start",    "log_scalars", "log_text", "log_image", "log_histogram",
                                          "log_table", "run_info", "flush",       "finish",   "destroy"};
std::string g_crash_frames[kStages];
volatile sig_atomic_t g_stage = kCreate;

extern "C" void on_crash(int sig) {
  const std::string& frame = g_crash_frames[g_stage];
  ssize_t unused = ::write(wire::kHostFd, frame.data(), frame.size());
  (void)unused;
  // SA_RESETHAND restored the default action: dying of the same signal tells the training
  // process which one it was.
  ::raise(sig);
}

void install_crash_handlers() {
  for (int i = 0; i < kStages; ++i) {
    wire::Writer w(Msg::Crashed);
    w.str(kStageNames[i]);
    g_crash_frames[i] = w.frame();
  }
  struct sigaction sa {};
  sa.sa_handler = on_crash;
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGTRAP, SIGSYS}) ::sigaction(sig, &sa, nullptr);
  // Ctrl-C and the launcher's SIGTERM are meant for the training process; when it ends, this
  // process sees its socket close and records the run as failed itself. A write to a closed
  // socket is an error return, not a signal.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
}

bool send(wire::Writer w) { return wire::send_all(wire::kHostFd, w.frame(), std::nullopt) == wire::Io::Done; }

void send_failed(const char* stage, const std::string& message) {
  wire::Writer w(Msg::Failed);
  w.str(stage).str(message);
  send(w);
}

// The plugin by its file (loading only that library); a file that declares several trackers
// is searched by name in its directory.
PluginSelection select_tracker(const std::string& file, const std::string& name) {
  auto& registry = PluginRegistry::instance();
  try {
    return registry.select(PluginKind::Tracker, file);
  } catch (const PluginError&) {
    registry.add_search_directories({std::filesystem::path(file).parent_path().string()});
    return registry.select(PluginKind::Tracker, name);
  }
}

int run() {
  std::string body;
  if (wire::read_frame(wire::kHostFd, body, std::nullopt) != wire::Io::Done) return 0;
  wire::Reader create(body);
  if (create.type() != Msg::Create) return 2;
  const std::string file = create.str();
  const std::string name = create.str();
  const std::string options = create.str();
  const std::string log_level = create.str();
  // Trackers that record which program ran (mlflow's mlflow.source.name) name the training
  // program, not this one.
  if (const std::string program = create.str(); !program.empty()) ::setenv("HASTEN_TRAINING_PROGRAM", program.c_str(), 1);
  auto context = std::make_unique<HostContext>();
  context->process.rank = create.i32();
  context->process.world_size = create.i32();
  context->process.local_rank = create.i32();
  context->process.local_world_size = create.i32();
  context->process.node_rank = create.i32();
  context->process.num_nodes = create.i32();
  set_log_level(log_level);

  std::unique_ptr<TrackerInstance> tracker;
  Stage stage = kCreate;
  auto at = [&](Stage s) { g_stage = stage = s; };
  try {
    at(kCreate);
    tracker = std::make_unique<TrackerInstance>(select_tracker(file, name), &context->api, options);
    if (!send(wire::Writer(Msg::Created).i32(tracker->keeps()))) return 0;
    for (;;) {
      const wire::Io r = wire::read_frame(wire::kHostFd, body, std::nullopt);
      if (r != wire::Io::Done) break;  // the training process is gone or ended without finish
      wire::Reader in(body);
      switch (in.type()) {
        case Msg::Start: {
          const std::string project = in.str();
          const std::string dir = in.str();
          const std::string hparams = in.str();
          const int rank = in.i32();
          at(kStart);
          tracker->start(project, dir, hparams, rank);
          send(wire::Writer(Msg::Started));
          break;
        }
        case Msg::Scalars: {
          const int64_t step = in.i64();
          const int32_t n = in.i32();
          std::vector<std::pair<std::string, double>> values;
          values.reserve(static_cast<size_t>(n));
          for (int32_t i = 0; i < n; ++i) {
            std::string key = in.str();
            values.emplace_back(std::move(key), in.f64());
          }
          at(kLogScalars);
          tracker->log_scalars(values, step);
          break;
        }
        case Msg::Text: {
          const int64_t step = in.i64();
          const std::string key = in.str();
          const std::string text = in.str();
          at(kLogText);
          tracker->log_text(key, text, step);
          break;
        }
        case Msg::Image: {
          const int64_t step = in.i64();
          const std::string key = in.str();
          const auto h = static_cast<uint32_t>(in.i32()), w = static_cast<uint32_t>(in.i32());
          const auto c = static_cast<uint32_t>(in.i32());
          const std::string bytes = in.str();
          if (bytes.size() != static_cast<size_t>(h) * w * c)
            throw std::runtime_error("tracker host message: an image of " + std::to_string(bytes.size()) +
                                     " bytes for " + std::to_string(h) + " x " + std::to_string(w) + " x " +
                                     std::to_string(c));
          at(kLogImage);
          tracker->log_image(key, std::vector<uint8_t>(bytes.begin(), bytes.end()), h, w, c, step);
          break;
        }
        case Msg::Histogram: {
          const int64_t step = in.i64();
          const std::string key = in.str();
          const std::string bytes = in.str();
          if (bytes.size() % sizeof(double) != 0)
            throw std::runtime_error("tracker host message: histogram values of " + std::to_string(bytes.size()) + " bytes");
          std::vector<double> values(bytes.size() / sizeof(double));
          std::memcpy(values.data(), bytes.data(), values.size() * sizeof(double));
          at(kLogHistogram);
          tracker->log_histogram(key, values, step);
          break;
        }
        case Msg::Table: {
          const int64_t step = in.i64();
          const std::string key = in.str();
          const std::string table = in.str();
          at(kLogTable);
          tracker->log_table(key, table, step);
          break;
        }
        case Msg::RunInfo: {
          at(kRunInfo);
          send(wire::Writer(Msg::Info).str(tracker->run_info()));
          break;
        }
        case Msg::Finish: {
          const auto status = static_cast<hasten_status>(in.i32());
          at(kFlush);
          tracker->flush();
          at(kFinish);
          tracker->finish(status);
          send(wire::Writer(Msg::Finished));
          at(kDestroy);
          tracker.reset();
          return 0;
        }
        default:
          return 2;
      }
    }
  } catch (const std::exception& e) {  // PluginError: the tracker failed; anything else: a bad frame
    send_failed(kStageNames[stage], e.what());
  }
  at(kDestroy);
  tracker.reset();
  return 0;
}

}  // namespace

int main() {
  install_crash_handlers();
  if (::fcntl(wire::kHostFd, F_GETFD) < 0) {
    std::fprintf(stderr, "hasten-tracker-host: runs trackers for a hasten training process, which starts it\n");
    return 2;
  }
  return run();
}
