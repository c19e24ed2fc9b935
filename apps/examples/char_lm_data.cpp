// Reading the fortunes corpus: the files are small (2.8 MB in all), so each is read whole and
// split at its `%` lines; nothing is cached.
#include "char_lm_data.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <iterator>

namespace hasten::examples {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read corpus file '" + p.string() + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("cannot read corpus file '" + p.string() + "'");
  return text;
}

// The fortunes of one file: the text between lines that hold only "%", each ending with its
// newline; blank fortunes are dropped.
std::vector<std::string> split_fortunes(const std::string& text) {
  std::vector<std::string> out;
  std::string current;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    const bool last = end == std::string::npos;
    if (last) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    if (line == "%") {
      if (current.find_first_not_of(" \t\r\n") != std::string::npos) out.push_back(current);
      current.clear();
    } else {
      current += line;
      current += '\n';
    }
    begin = end + 1;
  }
  if (current.find_first_not_of(" \t\r\n") != std::string::npos) out.push_back(current);
  return out;
}

}  // namespace

std::vector<std::string> corpus_files(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return names;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code ec2;
    if (!fs::is_regular_file(entry.path(), ec2)) continue;  // follows links; skips sub-directories
    if (ends_with(name, ".dat") || ends_with(name, ".u8") || name.empty() || name[0] == '.') continue;
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

Corpus load_fortunes(const std::string& dir, const std::vector<std::string>& names, double val_fraction) {
  const auto available = corpus_files(dir);
  if (available.empty())
    throw CorpusMissing("fortunes corpus not found: no fortune files in '" + dir +
                        "'; install Debian's package with `sudo apt-get install fortunes` (scripts/install-deps.sh "
                        "does), or point --data_dir at a directory of fortune files");
  Corpus c;
  if (names.empty()) {
    c.files = available;
  } else {
    std::set<std::string> chosen;
    for (const auto& n : names) {
      if (!std::binary_search(available.begin(), available.end(), n)) {
        std::string list;
        for (const auto& a : available) list += (list.empty() ? "" : " ") + a;
        throw CorpusRequestError("--files: no corpus file '" + n + "' in '" + dir + "' (available: " + list + ")");
      }
      chosen.insert(n);
    }
    c.files.assign(chosen.begin(), chosen.end());
  }
  int64_t i = 0;
  for (const auto& name : c.files) {
    for (const auto& fortune : split_fortunes(read_file(fs::path(dir) / name))) {
      const bool held_out = std::floor(static_cast<double>(i + 1) * val_fraction) >
                            std::floor(static_cast<double>(i) * val_fraction);
      std::string& to = held_out ? c.val_text : c.train_text;
      to += fortune;
      to += "%\n";
      c.val_fortunes += held_out ? 1 : 0;
      ++i;
    }
  }
  c.fortunes = i;
  if (c.val_fortunes == 0 || c.val_fortunes == c.fortunes)
    throw CorpusRequestError("--val_fraction " + std::to_string(val_fraction) + " holds out " +
                             std::to_string(c.val_fortunes) + " of the " + std::to_string(c.fortunes) +
                             " fortunes in the chosen files; both the training and the validation part need at "
                             "least one (choose more --files or another fraction in (0, 1))");
  return c;
}

torch::Tensor byte_windows(const std::string& text, int64_t context, int64_t max_windows) {
  const int64_t n = text.size() > 0 ? (static_cast<int64_t>(text.size()) - 1) / context : 0;
  auto bytes = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
  std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  auto tokens = bytes.to(torch::kLong);
  const int64_t keep = max_windows > 0 ? std::min(n, max_windows) : n;
  auto out = torch::empty({keep, context + 1}, torch::kLong);
  for (int64_t k = 0; k < keep; ++k) {
    const int64_t w = keep == n ? k : k * n / keep;  // evenly spaced when only some are kept
    out[k].copy_(tokens.narrow(0, w * context, context + 1));
  }
  return out;
}

hasten::Batch TokenWindows::get_batch(const std::vector<int64_t>& indices) const {
  const auto n = static_cast<int64_t>(indices.size());
  bool consecutive = n > 0;
  for (int64_t i = 1; i < n && consecutive; ++i) consecutive = indices[i] == indices[0] + i;
  const torch::Tensor rows = consecutive ? windows_.narrow(0, indices[0], n)
                                         : windows_.index_select(0, torch::tensor(indices, torch::kLong));
  const int64_t context = windows_.size(1) - 1;
  hasten::Batch b;
  b.fields["input_ids"] = rows.narrow(1, 0, context);
  b.fields["labels"] = rows.narrow(1, 1, context);
  b.indices = torch::tensor(indices, torch::kLong);
  return b;
}

double unigram_entropy(const std::string& text) {
  std::array<int64_t, 256> counts{};
  for (unsigned char ch : text) ++counts[ch];
  double h = 0;
  const double total = static_cast<double>(text.size());
  for (int64_t c : counts)
    if (c > 0) {
      const double p = static_cast<double>(c) / total;
      h -= p * std::log(p);
    }
  return h;
}

}  // namespace hasten::examples
