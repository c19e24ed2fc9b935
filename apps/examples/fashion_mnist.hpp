// hasten-fashion-mnist's flags and its training run: fashion_mnist.cpp trains, fashion_mnist_main.cpp parses the
// command line. Apart so that each compiles alone: an edit of hasten's headers does not
// recompile CLI11's (~8 s at -O3), and the training reads without the flags' plumbing.
#pragma once

#include <hasten/config.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "fashion_mnist_data.hpp"

namespace hasten::examples::fashion {

struct Args {
  int64_t epochs = 2;
  int64_t max_steps = 0;
  int64_t batch_size = 64;
  int64_t eval_batch_size = 256;
  double lr = 1e-3;
  uint64_t seed = 0;
  int threads = 1;
  int64_t log_every = 50;
  int64_t log_samples = 0;  // test images shown to the trackers with the model's guesses, each epoch
  std::string data_dir = kFashionMnistDir;
  bool resume = false, json = false, quiet = false;
};

// Trains with the flags `a` and the config `options`; returns the process's exit status.
int train(const Args& a, hasten::Options options);

}  // namespace hasten::examples::fashion
