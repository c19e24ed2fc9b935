// A tracker as init_trackers started it: in this process (a TrackerInstance) or, by default,
// in its own host process (hasten-tracker-host) fed through a socket, so that a tracker that
// crashes takes only its host down. The engine sees the same interface either way; a failure
// of either kind is a PluginError, which the engine reports once and drops the tracker for.
#pragma once

#include <hasten/error.hpp>
#include <hasten/logging.hpp>
#include <hasten/plugin.h>
#include <hasten/process.hpp>
#include <hasten/registry.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hasten::detail {

class RunningTracker {
 public:
  virtual ~RunningTracker() = default;
  virtual const std::string& name() const = 0;
  // Waits until the tracker is created (isolated: its host answered create). Host processes
  // start in parallel: init_trackers starts them all before waiting for the first.
  virtual void wait_created() {}
  virtual void start(const std::string& project, const std::string& logging_dir, const std::string& hparams_json,
                     int rank) = 0;
  virtual void log_scalars(const std::vector<std::pair<std::string, double>>& values, int64_t step) = 0;
  virtual void log_text(const std::string& name, const std::string& text, int64_t step) = 0;
  // What the tracker keeps beyond scalars (kKeeps* bits: the optional slots its plugin has).
  virtual int32_t keeps() const = 0;
  // pixels: height * width * channels bytes, HWC (hasten_tracker_vtable.log_image).
  virtual void log_image(const std::string& name, const std::vector<uint8_t>& pixels, uint32_t height, uint32_t width,
                         uint32_t channels, int64_t step) = 0;
  virtual void log_histogram(const std::string& name, const std::vector<double>& values, int64_t step) = 0;
  virtual void log_table(const std::string& name, const std::string& table_json, int64_t step) = 0;
  // What names the run in the tracker's terms (hasten_tracker_vtable.run_info): JSON text.
  virtual std::string run_info() = 0;
  // Flushes and finishes with status (the run's outcome).
  virtual void end(hasten_status status) = 0;
};

// A tracker's host process died (a signal, or it stopped answering): the tracker is gone,
// but unlike a create() that returned an error this is no configuration error.
class TrackerDied : public PluginError {
 public:
  using PluginError::PluginError;
};

// Runs op on every tracker; one that fails is reported once (its message names the plugin,
// its file and the path it could not write) and leaves the run.
template <class Op>
void for_each_tracker(std::vector<std::unique_ptr<RunningTracker>>& trackers, const char* what, Op&& op) {
  for (auto it = trackers.begin(); it != trackers.end();) {
    try {
      op(**it);
      ++it;
    } catch (const PluginError& e) {
      get_logger()->warn("tracker '{}' stopped at {}, training goes on without it: {}", (*it)->name(), what, e.what());
      it = trackers.erase(it);
    }
  }
}

// Creates the tracker in this process; a failing create() throws PluginError.
std::unique_ptr<RunningTracker> make_in_process_tracker(const PluginSelection& selection, const hasten_host_api* host,
                                                        const std::string& options_json);

// Starts a host process for the tracker and asks it to create the tracker; wait_created()
// then throws PluginError with the plugin's message for a create() that returned an error, and
// TrackerDied naming the tracker and how it ended for a host that died (as does this function
// for a host that cannot be started).
std::unique_ptr<RunningTracker> make_isolated_tracker(const PluginSelection& selection, const std::string& options_json,
                                                      const ProcessInfo& process, const std::string& log_level);

// The tracker host program next to libhasten (build tree: bin/, installed: libexec/hasten/).
std::string tracker_host_program();

}  // namespace hasten::detail
