// hasten::ProgressBar: training progress for a user's own loop (tqdm's job in Accelerate's
// examples). Redrawn in place on a terminal; plain periodic lines when the output is a file or
// a CI log, where carriage returns would pile up into one unreadable line. No LibTorch here, so
// tools without tensors can use it.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hasten {

struct ProgressOptions {
  // Text before the counter, e.g. "epoch 1/3".
  std::string description;
  // false: print nothing. Unset: only the local main process of the run (LOCAL_RANK 0 as the
  // launcher set it, docs/launch.md) prints, so N processes do not draw N bars.
  std::optional<bool> enabled;
  // Where to write; nullptr: std::cerr.
  std::ostream* stream = nullptr;
  // true: redraw one line in place (\r); false: plain lines. Unset: in place exactly when
  // `stream` is std::cerr and stderr is a terminal.
  std::optional<bool> in_place;
  // Plain lines: one each time another tenth of `total` is done, and one at least every
  // `line_interval_s` seconds in between (the only trigger when the total is unknown).
  double line_interval_s = 30.0;
  // In place: redraw at most this often, so a fast loop does not spend its time printing.
  double redraw_interval_s = 0.1;
  // Seconds from any fixed origin; unset: std::chrono::steady_clock. Tests set it.
  std::function<double()> clock;
};

class ProgressBar {
 public:
  // `total` steps; 0 when unknown (no percentage, no remaining time).
  explicit ProgressBar(int64_t total, ProgressOptions options = {});
  ~ProgressBar();  // close()
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Sets a named value shown after the counter ("loss 0.4123"), kept until set again; values
  // appear in the order first set.
  void set(const std::string& name, double value);
  // `steps` more steps done, which processed `samples` samples in all (0: no samples/s shown).
  void update(int64_t steps = 1, int64_t samples = 0);
  // The final state: one last line (plain) or the finished bar and a newline (in place).
  // Later calls do nothing.
  void close();

  int64_t step() const { return step_; }
  bool enabled() const { return enabled_; }
  // The line as it would be printed now, without the bar's own control characters.
  std::string line() const;

 private:
  void emit(bool final);
  double now() const;

  int64_t total_;
  ProgressOptions options_;
  bool enabled_ = true;
  bool in_place_ = false;
  bool closed_ = false;
  int64_t step_ = 0;
  int64_t samples_ = 0;
  double start_ = 0;
  double last_emit_ = 0;
  int64_t last_step_emitted_ = -1;
  int64_t next_tenth_ = 1;  // plain lines: the next tenth of total that prints
  size_t last_width_ = 0;   // in place: characters of the previous draw, to blank leftovers
  std::vector<std::pair<std::string, double>> values_;
};

// "1:02:03" or "02:03": how the bar writes durations.
std::string format_duration(double seconds);

}  // namespace hasten
