// hasten::ProgressBar: the counters, when to print, and the two output forms.
#include <hasten/progress.hpp>
#include <hasten/process.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

namespace hasten {

namespace {

constexpr int kBarWidth = 24;

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

bool default_enabled() {
  // A malformed launcher environment is the Accelerator's error to report; progress output
  // just stays on.
  try {
    return detect_process_info(current_environment()).is_local_main_process();
  } catch (const std::exception&) {
    return true;
  }
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[48];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

ProgressBar::ProgressBar(int64_t total, ProgressOptions options)
    : total_(std::max<int64_t>(total, 0)), options_(std::move(options)) {
  enabled_ = options_.enabled.has_value() ? *options_.enabled : default_enabled();
  if (options_.stream == nullptr) options_.stream = &std::cerr;
  in_place_ = options_.in_place.has_value() ? *options_.in_place
                                            : options_.stream == &std::cerr && ::isatty(STDERR_FILENO) == 1;
  start_ = last_emit_ = now();
}

ProgressBar::~ProgressBar() {
  try {
    close();
  } catch (...) {  // a destructor must not throw (a stream set to throw on failure)
  }
}

double ProgressBar::now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void ProgressBar::set(const std::string& name, double value) {
  for (auto& [n, v] : values_)
    if (n == name) {
      v = value;
      return;
    }
  values_.emplace_back(name, value);
}

std::string ProgressBar::line() const {
  const double elapsed = now() - start_;
  std::ostringstream out;
  if (!options_.description.empty()) out << options_.description << "  ";
  out << step_;
  if (total_ > 0) out << "/" << total_ << " (" << std::min<int64_t>(100, step_ * 100 / total_) << "%)";
  for (const auto& [n, v] : values_) out << "  " << n << " " << number(v);
  if (samples_ > 0 && elapsed > 0) out << "  " << std::llround(static_cast<double>(samples_) / elapsed) << " samples/s";
  out << "  elapsed " << format_duration(elapsed);
  if (total_ > 0 && step_ < total_)
    out << "  remaining " << (step_ > 0 ? format_duration(elapsed / static_cast<double>(step_) *
                                                          static_cast<double>(total_ - step_))
                                        : std::string("--:--"));
  return out.str();
}

void ProgressBar::emit(bool final) {
  std::ostream& out = *options_.stream;
  last_emit_ = now();
  last_step_emitted_ = step_;
  if (!in_place_) {
    out << line() << '\n';
    out.flush();
    return;
  }
  std::string text = line();
  if (total_ > 0) {
    const auto filled = static_cast<int>(std::min<int64_t>(step_, total_) * kBarWidth / total_);
    const std::string bar = "[" + std::string(static_cast<size_t>(filled), '#') +
                            std::string(static_cast<size_t>(kBarWidth - filled), '.') + "] ";
    text = bar + text;
  }
  const size_t width = text.size();
  // Spaces over what a longer previous draw left behind (no terminal escape codes: a dumb
  // terminal or an emulator without them still shows a clean line).
  if (width < last_width_) text += std::string(last_width_ - width, ' ');
  last_width_ = width;
  out << '\r' << text;
  if (final) out << '\n';
  out.flush();
}

void ProgressBar::update(int64_t steps, int64_t samples) {
  if (closed_) return;
  step_ += std::max<int64_t>(steps, 0);
  samples_ += std::max<int64_t>(samples, 0);
  if (!enabled_) return;
  const double t = now();
  if (in_place_) {
    if (t - last_emit_ >= options_.redraw_interval_s || (total_ > 0 && step_ >= total_)) emit(false);
    return;
  }
  bool due = t - last_emit_ >= options_.line_interval_s;
  if (total_ > 0 && step_ * 10 >= next_tenth_ * total_) {
    due = true;
    next_tenth_ = step_ * 10 / total_ + 1;
  }
  if (due) emit(false);
}

void ProgressBar::close() {
  if (closed_) return;
  closed_ = true;
  if (!enabled_) return;
  // Plain: the last line only when the state changed since the previous one; in place: the
  // finished bar, then a newline so that what follows starts on its own line.
  if (in_place_ ? last_step_emitted_ >= 0 || step_ > 0 : step_ != last_step_emitted_) emit(true);
}

}  // namespace hasten
