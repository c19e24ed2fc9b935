// The fortunes corpus of Debian's `fortunes` package as byte streams for a character-level
// language model: the plain text files under /usr/share/games/fortunes (fortunes separated by
// lines holding only `%`), split into training and held-out fortunes.
#pragma once

#include <hasten/batch.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hasten::examples {

// Where Debian's package installs the corpus.
inline const char* const kFortunesDir = "/usr/share/games/fortunes";

// The corpus is absent from the directory (not installed, or a wrong --data_dir).
struct CorpusMissing : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A request the corpus cannot satisfy (an unknown --files name, a held-out fraction that leaves
// no training or no validation text): std::invalid_argument, reported like a bad flag.
struct CorpusRequestError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct Corpus {
  std::vector<std::string> files;  // the file names used, sorted
  int64_t fortunes = 0;            // fortunes read from them (empty ones dropped)
  int64_t val_fortunes = 0;        // of which held out
  std::string train_text;          // the training fortunes, each followed by "%\n" as in the files
  std::string val_text;            // the held-out ones, the same way
};

// The corpus files in `dir`: regular files (or links to them) except the strfile indexes
// (`*.dat`) and the UTF-8 conversions (`*.u8`), sorted by name. Empty when there is none.
std::vector<std::string> corpus_files(const std::string& dir);

// Reads `names` (all of corpus_files(dir) when empty) and holds out fortune i (counted over
// the files in name order) when floor((i + 1) * val_fraction) > floor(i * val_fraction): an
// evenly spread val_fraction of every file. Throws CorpusMissing when `dir` has no corpus
// file, CorpusRequestError for a name that is not one of them or a split with an empty side,
// std::runtime_error naming a file that cannot be read.
Corpus load_fortunes(const std::string& dir, const std::vector<std::string>& names, double val_fraction);

// Non-overlapping windows of context + 1 bytes over `text` (stride context: every byte but the
// first is predicted once), as int64 tokens (the byte values, vocabulary 256). Shape
// [windows, context + 1]; `max_windows` > 0 keeps that many, evenly spaced over the text.
torch::Tensor byte_windows(const std::string& text, int64_t context, int64_t max_windows = 0);

// byte_windows as a language model's batches of named tensors: "input_ids" (each window's
// first context bytes) and "labels" (its last context: the byte after each position).
// Consecutive indices are views, as TensorDataset's.
class TokenWindows {
 public:
  explicit TokenWindows(torch::Tensor windows) : windows_(std::move(windows)) {}
  size_t size() const { return static_cast<size_t>(windows_.size(0)); }
  hasten::Batch get_batch(const std::vector<int64_t>& indices) const;

 private:
  torch::Tensor windows_;
};

// Entropy in nats per byte of the bytes' frequencies in `text`: the loss of the best model that
// ignores context.
double unigram_entropy(const std::string& text);

}  // namespace hasten::examples
