// hasten-char-lm's flags and its training run: char_lm.cpp trains, char_lm_main.cpp parses the
// command line. Apart so that each compiles alone: an edit of hasten's headers does not
// recompile CLI11's (~8 s at -O3), and the training reads without the flags' plumbing.
#pragma once

#include <hasten/config.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "char_lm_data.hpp"

namespace hasten::examples::char_lm {

struct Args {
  int64_t epochs = 1;
  int64_t max_steps = 0;
  int64_t batch_size = 8;
  int64_t eval_batch_size = 64;
  int64_t accumulation = 4;
  int64_t context = 64;
  int64_t d_model = 128;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  double lr = 2e-3;
  double weight_decay = 0.1;
  int64_t warmup_steps = -1;  // -1: a tenth of the optimizer steps
  double max_grad_norm = 1.0;
  double val_fraction = 0.1;
  int64_t val_windows = 256;
  uint64_t seed = 0;
  int threads = 1;
  int num_workers = 0;
  bool gradient_checkpointing = false;  // recompute each block's activations in backward  // DataLoader worker threads (0: the training thread reads the batches)
  int64_t log_every = 10;
  int64_t checkpoint_every = 0;
  int64_t sample_chars = 300;
  double temperature = 0.8;
  std::string prompt;
  std::string data_dir = kFortunesDir;
  std::vector<std::string> files;
  std::string init_from, save_model;
  bool resume = false, json = false, quiet = false;
};

// Trains with the flags `a` and the config `options`; returns the process's exit status.
int train(const Args& a, hasten::Options options);

}  // namespace hasten::examples::char_lm
