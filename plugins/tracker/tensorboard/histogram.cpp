#include "histogram.hpp"

#include <algorithm>
#include <vector>

namespace hasten::tensorboard {

namespace {

// tensorboard.summary's default_bins(): -1e20 .. -1e-12, 0, 1e-12 .. 1e20 by factors of 1.1.
const std::vector<double>& default_edges() {
  static const std::vector<double> edges = [] {
    std::vector<double> pos;
    for (double v = 1e-12; v < 1e20; v *= 1.1) pos.push_back(v);
    std::vector<double> e;
    e.reserve(pos.size() * 2 + 1);
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) e.push_back(-*it);
    e.push_back(0.0);
    e.insert(e.end(), pos.begin(), pos.end());
    return e;
  }();
  return edges;
}

}  // namespace

void fill_histogram(const double* values, uint64_t n, hasten::tb::HistogramProto& out) {
  const auto& edges = default_edges();
  // Bucket i holds [edges[i], edges[i + 1]), the last one closed, as numpy.histogram counts;
  // values beyond the outer edges (about +-9.9e19) are in min, max, num and sum but in no
  // bucket, as there.
  std::vector<double> counts(edges.size() - 1, 0.0);
  double lo = 0, hi = 0, sum = 0, squares = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double v = values[i];
    if (i == 0 || v < lo) lo = v;
    if (i == 0 || v > hi) hi = v;
    sum += v;
    squares += v * v;
    if (v < edges.front() || v > edges.back()) continue;
    auto b = static_cast<int64_t>(std::upper_bound(edges.begin(), edges.end(), v) - edges.begin()) - 1;
    b = std::min<int64_t>(b, static_cast<int64_t>(counts.size()) - 1);  // the last edge: the last bucket
    counts[static_cast<size_t>(b)] += 1;
  }
  out.set_min(lo);
  out.set_max(hi);
  out.set_num(static_cast<double>(n));
  out.set_sum(sum);
  out.set_sum_squares(squares);
  if (std::all_of(counts.begin(), counts.end(), [](double c) { return c == 0; })) return;  // nothing in range
  // The span of non-empty buckets and the empty one left of it, each written as its upper
  // limit, so that the leftmost limit is there too: SummaryWriter's make_histogram (a first
  // bucket that holds values gets an empty one of limit -1e20 before it).
  size_t first = 0, last = counts.size() - 1;
  while (counts[first] == 0) ++first;
  while (counts[last] == 0) --last;
  if (first == 0) {
    out.add_bucket_limit(edges[0]);
    out.add_bucket(0);
  }
  for (size_t b = first > 0 ? first - 1 : 0; b <= last; ++b) {
    out.add_bucket_limit(edges[b + 1]);
    out.add_bucket(counts[b]);
  }
}

}  // namespace hasten::tensorboard
