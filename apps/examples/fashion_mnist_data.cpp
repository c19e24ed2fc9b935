// The IDX reader behind load_fashion_mnist: zlib's gzread decompresses on the fly (and reads a
// file that is not gzip as it is), so nothing is unpacked to disk and no cache goes stale.
#include "fashion_mnist_data.hpp"

#include <zlib.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

namespace hasten::examples {

namespace {

namespace fs = std::filesystem;

// The per-pixel statistics of the training images, so inputs are centred as in the data
// set's published baselines.
constexpr double kMean = 0.2860;
constexpr double kStd = 0.3530;

std::string find_file(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {name + ".gz", name}) {
    const fs::path p = fs::path(dir) / candidate;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  throw DataSetMissing("Fashion-MNIST not found: no " + name + ".gz (or " + name + ") in '" + dir +
                       "'; install it with `sudo apt-get install dataset-fashion-mnist` (or `make demo`, "
                       "which does), or point --data_dir at a directory holding the four IDX files");
}

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

// The whole (decompressed) content of an IDX file.
std::vector<uint8_t> read_all(const std::string& path) {
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) throw std::runtime_error("cannot open '" + path + "'");
  gzbuffer(f.get(), 1 << 20);
  std::vector<uint8_t> bytes;
  std::array<uint8_t, 1 << 16> chunk{};
  for (;;) {
    const int n = gzread(f.get(), chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      throw std::runtime_error("'" + path + "' is damaged: " + gzerror(f.get(), &code));
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + n);
  }
  return bytes;
}

uint32_t big_endian(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) | uint32_t{b[at + 3]};
}

// IDX: a magic number (0x0000 08 <number of dimensions>: unsigned bytes), the dimensions as
// big-endian 32-bit counts, then the bytes row-major.
torch::Tensor read_idx(const std::string& path, uint32_t dims) {
  const std::vector<uint8_t> b = read_all(path);
  const size_t header = 4 + 4 * size_t{dims};
  if (b.size() < header || big_endian(b, 0) != (0x0800u | dims))
    throw std::runtime_error("'" + path + "' is not an IDX file of unsigned bytes with " + std::to_string(dims) +
                             " dimension(s)");
  std::vector<int64_t> shape;
  size_t count = 1;
  for (uint32_t d = 0; d < dims; ++d) {
    shape.push_back(big_endian(b, 4 + 4 * size_t{d}));
    count *= static_cast<size_t>(shape.back());
  }
  if (b.size() != header + count)
    throw std::runtime_error("'" + path + "' holds " + std::to_string(b.size() - header) + " data bytes, its header says " +
                             std::to_string(count) + " (truncated?)");
  auto t = torch::empty(shape, torch::kUInt8);
  std::copy(b.begin() + static_cast<std::ptrdiff_t>(header), b.end(), t.data_ptr<uint8_t>());
  return t;
}

std::pair<torch::Tensor, torch::Tensor> read_split(const std::string& dir, const std::string& prefix) {
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  auto images = read_idx(images_path, 3);
  auto labels = read_idx(labels_path, 1);
  if (images.size(1) != 28 || images.size(2) != 28)
    throw std::runtime_error("'" + images_path + "' holds " + std::to_string(images.size(1)) + "x" +
                             std::to_string(images.size(2)) + " images, Fashion-MNIST's are 28x28");
  if (images.size(0) != labels.size(0))
    throw std::runtime_error("'" + images_path + "' holds " + std::to_string(images.size(0)) + " images but '" +
                             labels_path + "' " + std::to_string(labels.size(0)) + " labels");
  if (labels.numel() > 0 && labels.max().item<int64_t>() > 9)
    throw std::runtime_error("'" + labels_path + "' holds labels above 9 (Fashion-MNIST has 10 classes)");
  auto x = images.to(torch::kFloat).div_(255.0).sub_(kMean).div_(kStd).unsqueeze(1);
  return {x, labels.to(torch::kLong)};
}

}  // namespace

FashionMnist load_fashion_mnist(const std::string& dir) {
  FashionMnist d;
  std::tie(d.train_images, d.train_labels) = read_split(dir, "train");
  std::tie(d.test_images, d.test_labels) = read_split(dir, "t10k");
  return d;
}

}  // namespace hasten::examples
