// hasten-bench --max-model: the largest gpt-style model each side trains on 2 processes within
// a memory budget (the processes' summed peak resident memory over 3 training steps).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hasten::bench {

// The model family: size s is a gpt-tiny-shaped transformer of width 32 s (heads of 32,
// feed-forward 4 x width) and depth max(1, s / 2), so that depth and width grow together and
// the parameter count grows about as s^3 (size 34: width 1088, 17 layers, 242 M parameters).
// Each trial: processes, optimizer steps, and the vocabulary (gpt-tiny's).
inline constexpr int kMaxModelProcesses = 2;
inline constexpr int kMaxModelSteps = 3;
inline constexpr int64_t kMaxModelVocab = 96;

struct GptShape {
  int64_t d_model, layers, nhead, ff;
};
GptShape gpt_shape(int size);

struct MaxModelOptions {
  uint64_t budget_bytes = 8ull << 30;  // for both processes together
  std::vector<std::string> sides = {"ddp2", "zero3", "torch-ddp2"};
  int seq = 16, batch = 1;  // tokens per process and step: the model's state decides, not activations
  int max_size = 128;       // never try a larger size
  int start_size = 1;       // the first size tried: the search doubles up from it or halves down
  std::string self;         // this program, for the hasten trials
  std::string peer;         // tests/integration/peers/torch_peer.py, for torch-ddp2
  // torch-ddp2's interpreter. Empty (the default): $HASTEN_BENCH_PYTHON where set (the project's
  // .venv/bin/python), else python3 from PATH; a name without a slash is looked up on PATH.
  std::string python;
};

// Runs the searches; one JSON line per trial and one per side's result on stdout. Returns
// non-zero when a search could not run (a trial failed for another reason than memory).
int max_model(const MaxModelOptions& options);

// One trial, run by the child process max_model() starts: 3 steps of the size-s model under
// mode (ddp2, zero3) on 2 processes; rank 0 prints {"params", "peak_rss_mb": [per rank]}.
void max_model_trial(const std::string& mode, int size, int seq, int batch);

}  // namespace hasten::bench
