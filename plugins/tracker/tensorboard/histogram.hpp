// A histogram as TensorBoard's writers make one (PyTorch's SummaryWriter.add_histogram with
// its default bins="tensorflow", TensorFlow's own summaries): buckets whose limits grow by 10%
// from 1e-12 to 1e20 on each side of 0, only the span that holds values (and the empty bucket
// left of it) written.
#pragma once

#include <cstdint>

#include "hasten_tb/summary.pb.h"

namespace hasten::tensorboard {

// values: n finite doubles (the host passes the finite ones only).
void fill_histogram(const double* values, uint64_t n, hasten::tb::HistogramProto& out);

}  // namespace hasten::tensorboard
