// Tracker calls beyond scalars: text, images, histograms and tables (Accelerator::log_text,
// log_images, log_histogram, log_table). The tensors become what the tracker ABI takes (uint8 HWC pixels,
// doubles, a table's JSON) here, once for every tracker, and each call goes only to the trackers
// whose plugin has the slot; a tracker without it is named once per kind, so that nothing a
// program logs disappears without a word.
#include <hasten/detail/engine.hpp>
#include <hasten/error.hpp>
#include <hasten/logging.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_state.hpp"
#include "trackers/tracker_instance.hpp"

namespace hasten::detail {

namespace {

// The most values a histogram passes on: more are sampled with an even stride (a tracker's
// buckets do not need every value of a large tensor, and a host process's frame has a limit).
constexpr int64_t kMaxHistogramValues = int64_t{1} << 24;
// The largest image passed on (64 MiB of pixels: 4096 x 4096 RGBA): a tracker host process's
// frames have a limit, and no tracker shows a bigger picture.
constexpr int64_t kMaxImageBytes = int64_t{64} << 20;

bool is_channels(int64_t n) { return n == 1 || n == 3 || n == 4; }

// HWC uint8 pixels of an image tensor, as TensorBoard's add_image reads one: [H, W] grey;
// [C, H, W] (its default) or [H, W, C] with C 1, 3 or 4; floating values in [0, 1], or uint8
// values as they are.
torch::Tensor to_pixels(const std::string& name, const torch::Tensor& image) {
  const std::string what = "log_images: image '" + name + "'";
  if (!image.defined()) throw UsageError(what + " is an undefined tensor");
  torch::Tensor t = image.detach().to(torch::kCPU);
  if (t.dim() == 2) {
    t = t.unsqueeze(2);
  } else if (t.dim() == 3) {
    if (is_channels(t.size(0))) t = t.permute({1, 2, 0});  // CHW, also where both ends could be channels
    else if (!is_channels(t.size(2)))
      throw UsageError(what + " has shape " + c10::str(t.sizes()) +
                       ": neither [C, H, W] nor [H, W, C] with C 1, 3 or 4 (allowed: [H, W], [C, H, W], [H, W, C])");
  } else {
    throw UsageError(what + " has " + std::to_string(t.dim()) + " dimensions (allowed: [H, W], [C, H, W], [H, W, C])");
  }
  if (t.size(0) == 0 || t.size(1) == 0) throw UsageError(what + " is empty: " + c10::str(image.sizes()));
  if (t.numel() > kMaxImageBytes)
    throw UsageError(what + " has " + std::to_string(t.numel()) + " pixel values (allowed: at most " +
                     std::to_string(kMaxImageBytes) + ", e.g. 4096 x 4096 RGBA)");
  if (t.scalar_type() == torch::kUInt8) return t.contiguous();
  if (!t.is_floating_point())
    throw UsageError(what + " is " + std::string(c10::toString(t.scalar_type())) +
                     " (allowed: uint8 values 0-255, or floating values 0-1)");
  // As SummaryWriter.add_image: times 255, clipped, truncated to uint8.
  return (t.to(torch::kFloat) * 255).clamp(0, 255).to(torch::kUInt8).contiguous();
}

using Trackers = std::vector<std::unique_ptr<RunningTracker>>;
using Skips = std::set<std::pair<std::string, int32_t>>;

// Runs op on the trackers that keep `bit`'s kind; names once per tracker and kind one that does
// not; drops one that fails, as every tracker call does (trackers.cpp).
template <class Op>
void to_trackers_that_keep(Trackers& trackers, Skips& skips, int32_t bit, const char* kind, const char* call, Op&& op) {
  for_each_tracker(trackers, call, [&](RunningTracker& t) {
    if ((t.keeps() & bit) != 0) return op(t);
    if (skips.insert({t.name(), bit}).second)
      get_logger()->warn("tracker '{}' keeps no {}: {} skips it (said once)", t.name(), kind, call);
  });
}

}  // namespace

void Engine::log_text(const std::string& name, const std::string& text, int64_t step) {
  Impl& s = *impl_;
  to_trackers_that_keep(s.trackers, s.tracker_skips, kKeepsText, "text", "log_text",
                        [&](RunningTracker& t) { t.log_text(name, text, step); });
}

void Engine::log_images(const std::vector<std::pair<std::string, torch::Tensor>>& images, int64_t step) {
  Impl& s = *impl_;
  // Checked on every rank, so that a bad image is the same error everywhere.
  std::vector<std::pair<std::string, torch::Tensor>> pixels;
  for (const auto& [name, image] : images) pixels.emplace_back(name, to_pixels(name, image));
  if (s.trackers.empty()) return;
  for (const auto& [name, p] : pixels) {
    const auto* data = p.data_ptr<uint8_t>();
    const std::vector<uint8_t> bytes(data, data + p.numel());
    to_trackers_that_keep(s.trackers, s.tracker_skips, kKeepsImages, "images", "log_images", [&](RunningTracker& t) {
      t.log_image(name, bytes, static_cast<uint32_t>(p.size(0)), static_cast<uint32_t>(p.size(1)),
                  static_cast<uint32_t>(p.size(2)), step);
    });
  }
}

void Engine::log_histogram(const std::string& name, const torch::Tensor& values, int64_t step) {
  Impl& s = *impl_;
  if (!values.defined()) throw UsageError("log_histogram: '" + name + "' is an undefined tensor");
  if (!values.is_floating_point() && values.scalar_type() != torch::kBool && !c10::isIntegralType(values.scalar_type(), false))
    throw UsageError("log_histogram: '" + name + "' is " + std::string(c10::toString(values.scalar_type())) +
                     " (allowed: floating or integer values)");
  if (s.trackers.empty()) return;
  torch::Tensor v = values.detach().reshape(-1).to(torch::kCPU, torch::kDouble);
  const torch::Tensor finite = torch::isfinite(v);
  const int64_t dropped = v.numel() - finite.sum().item<int64_t>();
  if (dropped > 0) {
    get_logger()->warn("log_histogram: '{}' holds {} NaN or infinite values of {}; the histogram counts the finite ones",
                       name, dropped, v.numel());
    v = v.masked_select(finite);
  }
  if (v.numel() == 0) {
    get_logger()->warn("log_histogram: '{}' has no finite values; no histogram is logged", name);
    return;
  }
  if (v.numel() > kMaxHistogramValues) {
    const int64_t stride = (v.numel() + kMaxHistogramValues - 1) / kMaxHistogramValues;
    v = v.slice(0, 0, v.numel(), stride).contiguous();
  }
  const std::vector<double> out(v.data_ptr<double>(), v.data_ptr<double>() + v.numel());
  to_trackers_that_keep(s.trackers, s.tracker_skips, kKeepsHistograms, "histograms", "log_histogram",
                        [&](RunningTracker& t) { t.log_histogram(name, out, step); });
}

void Engine::log_table(const std::string& name, const std::vector<std::string>& columns,
                       const std::vector<std::vector<TableCell>>& rows, int64_t step) {
  Impl& s = *impl_;
  if (columns.empty()) throw UsageError("log_table: table '" + name + "' has no columns");
  nlohmann::json data = nlohmann::json::array();
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].size() != columns.size())
      throw UsageError("log_table: table '" + name + "' row " + std::to_string(r) + " has " +
                       std::to_string(rows[r].size()) + " cells for " + std::to_string(columns.size()) + " columns");
    nlohmann::json row = nlohmann::json::array();
    for (const auto& cell : rows[r]) {
      if (const auto* text = std::get_if<std::string>(&cell)) row.push_back(*text);
      else if (const double d = std::get<double>(cell); std::isfinite(d)) row.push_back(d);
      else row.push_back(std::isnan(d) ? "nan" : (d > 0 ? "inf" : "-inf"));
    }
    data.push_back(std::move(row));
  }
  if (s.trackers.empty()) return;
  const std::string table = nlohmann::json{{"columns", columns}, {"data", data}}.dump();
  to_trackers_that_keep(s.trackers, s.tracker_skips, kKeepsTables, "tables", "log_table", [&](RunningTracker& t) { t.log_table(name, table, step); });
}

}  // namespace hasten::detail
