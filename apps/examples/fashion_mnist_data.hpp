// Fashion-MNIST from the IDX files of Debian's dataset-fashion-mnist package (gzip, or already
// decompressed), as tensors ready for a hasten::TensorDataset.
#pragma once

#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace hasten::examples {

// Where Debian's package installs the four files.
inline const char* const kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct FashionMnist {
  torch::Tensor train_images;  // [60000, 1, 28, 28] float32, normalised (mean 0, std 1 overall)
  torch::Tensor train_labels;  // [60000] int64 in [0, 10)
  torch::Tensor test_images;   // [10000, 1, 28, 28]
  torch::Tensor test_labels;   // [10000]
};

// The data set is absent from the directory (not installed, or a wrong --data_dir).
struct DataSetMissing : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads train-images-idx3-ubyte(.gz) and the three others from `dir`. Throws DataSetMissing
// when a file is absent, std::runtime_error naming the file when one is damaged (bad magic
// number, wrong image size, truncated, labels outside 0-9, images and labels of different
// counts).
FashionMnist load_fashion_mnist(const std::string& dir);

}  // namespace hasten::examples
