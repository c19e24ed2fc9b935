// LibTorch's map-style datasets through hasten::DataLoader and prepare: MNIST (a synthetic
// one written in the IDX format) with Normalize<> and Stack<>, a user's Dataset<Self>, and on
// several ranks the same shards, padding and gather_for_metrics as hasten's own loader.
#include <hasten/hasten.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <type_traits>

#include "test_util.hpp"

using hasten::Accelerator;
namespace data = torch::data;
namespace F = torch::nn::functional;

namespace {

hasten::Options isolated() {
  hasten::test::isolate_home();
  return {};
}

using hasten::test::require;
using hasten::test::with_ranks;

void write_be32(std::ofstream& out, uint32_t v) {
  const char bytes[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                         static_cast<char>(v)};
  out.write(bytes, 4);
}

// MNIST's test split in the IDX format (big-endian headers, uncompressed). LibTorch's reader
// insists on the real split sizes, so it has 10000 images; two classes, told apart by which
// half of the image is bright, so that a linear model learns them in an epoch.
constexpr int64_t kMnistTestSize = 10000;
void write_mnist(const std::filesystem::path& dir) {
  std::ofstream images(dir / "t10k-images-idx3-ubyte", std::ios::binary);
  std::ofstream labels(dir / "t10k-labels-idx1-ubyte", std::ios::binary);
  write_be32(images, 2051);
  write_be32(images, kMnistTestSize);
  write_be32(images, 28);
  write_be32(images, 28);
  write_be32(labels, 2049);
  write_be32(labels, kMnistTestSize);
  std::mt19937 gen(42);
  std::uniform_int_distribution<int> bright(120, 255), dark(0, 90);
  std::vector<char> pixels(28 * 28);
  for (int64_t i = 0; i < kMnistTestSize; ++i) {
    const int label = static_cast<int>((i * 7) % 11 % 2);  // not simply alternating
    for (int p = 0; p < 28 * 28; ++p) {
      const bool top = p < 14 * 28;
      pixels[static_cast<size_t>(p)] = static_cast<char>(top == (label == 0) ? bright(gen) : dark(gen));
    }
    images.write(pixels.data(), static_cast<std::streamsize>(pixels.size()));
    labels.put(static_cast<char>(label));
  }
}

const torch::Tensor& inputs(const hasten::Batch& b) { return b.input; }
const torch::Tensor& inputs(const hasten::ExampleBatch& b) { return b.data; }

struct Trained {
  std::vector<torch::Tensor> parameters;
  double first_loss = 0, last_epoch_loss = 0;
  std::vector<int64_t> first_indices;  // of the first batch
};

// Two epochs of a linear classifier through prepare; the same seeds for every loader.
template <class Dataset>
Trained train(hasten::DataLoader<Dataset> data) {
  Accelerator acc(isolated());
  torch::manual_seed(0);
  auto model = std::make_shared<torch::nn::LinearImpl>(28 * 28, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01));
  auto [net, opt, loader] = acc.prepare(model, sgd, data);
  Trained out;
  for (int epoch = 0; epoch < 2; ++epoch) {
    double sum = 0;
    int64_t steps = 0;
    for (auto& batch : loader) {
      auto loss = F::cross_entropy(net(inputs(batch).flatten(1)), batch.target);
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
      if (epoch == 0 && steps == 0) {
        out.first_loss = loss.template item<double>();
        auto idx = batch.indices;
        out.first_indices.assign(idx.template data_ptr<int64_t>(), idx.template data_ptr<int64_t>() + idx.numel());
      }
      sum += loss.template item<double>();
      ++steps;
    }
    out.last_epoch_loss = sum / static_cast<double>(steps);
  }
  for (auto& p : model->parameters()) out.parameters.push_back(p.detach().clone());
  return out;
}

// A user's dataset: sample i is (i, -i) with target i.
struct Numbers : data::datasets::Dataset<Numbers> {
  explicit Numbers(size_t n) : n(n) {}
  data::Example<> get(size_t i) override {
    const auto v = static_cast<float>(i);
    return {torch::tensor({v, -v}), torch::tensor(static_cast<int64_t>(i))};
  }
  torch::optional<size_t> size() const override { return n; }
  size_t n;
};

// The same samples for hasten's own loader.
hasten::TensorDataset numbers_tensors(int64_t n) {
  auto i = torch::arange(n, torch::kFloat);
  return hasten::TensorDataset(torch::stack({i, -i}, 1), torch::arange(n, torch::kLong));
}

std::vector<int64_t> as_vector(const torch::Tensor& t) {
  auto c = t.contiguous().to(torch::kLong);
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Stops after two batches of the first epoch with a checkpoint, then resumes in a new
// Accelerator: the batches the resumed loader yields for the rest of that epoch and the next.
template <class Dataset>
std::vector<std::vector<int64_t>> resumed(const hasten::DataLoader<Dataset>& data, const std::filesystem::path& project) {
  hasten::Options o = isolated();
  o.project_dir = project.string();
  {
    Accelerator acc(o);
    auto loader = acc.prepare(data);
    int seen = 0;
    for (auto& batch : loader) {
      (void)batch;
      if (++seen == 2) {
        acc.save_state();  // mid-epoch
        break;
      }
    }
  }
  Accelerator acc(o);
  auto loader = acc.prepare(data);
  acc.load_state();
  std::vector<std::vector<int64_t>> out;
  for (int epoch = 0; epoch < 2; ++epoch)
    for (auto& batch : loader) out.push_back(as_vector(batch.indices));
  return out;
}

// The batch type follows the dataset: LibTorch's datasets keep LibTorch's names.
using Mnist = data::datasets::MNIST;
using Normalized = data::datasets::MapDataset<Mnist, data::transforms::Normalize<>>;
using NormalizedStacked = data::datasets::MapDataset<Normalized, data::transforms::Stack<>>;
static_assert(std::is_same_v<hasten::DataLoader<NormalizedStacked>::batch_type, hasten::ExampleBatch>);
static_assert(std::is_same_v<hasten::DataLoader<Mnist>::batch_type, hasten::ExampleBatch>);
static_assert(std::is_same_v<hasten::DataLoader<Numbers>::batch_type, hasten::ExampleBatch>);
static_assert(std::is_same_v<hasten::PreparedDataLoader<Numbers>::batch_type, hasten::ExampleBatch>);
static_assert(std::is_same_v<hasten::DataLoader<hasten::TensorDataset>::batch_type, hasten::Batch>);
static_assert(std::is_base_of_v<data::Example<>, hasten::ExampleBatch>);

}  // namespace

TEST(TorchDatasets, MnistWithNormalizeAndStackTrainsThroughPrepareLikeATensorDataset) {
  hasten::test::TempDir dir;
  write_mnist(dir.path());
  const hasten::DataLoaderOptions options{.batch_size = 64, .shuffle = true, .seed = 3};
  hasten::DataLoader mnist(Mnist(dir.path().string(), Mnist::Mode::kTest)
                               .map(data::transforms::Normalize<>(0.1307, 0.3081))
                               .map(data::transforms::Stack<>()),
                           options);
  ASSERT_EQ(mnist.dataset_size(), static_cast<size_t>(kMnistTestSize));
  const Trained torch_path = train(mnist);

  // The same normalised tensors in hasten's own dataset: the same batches, the same steps.
  Mnist raw(dir.path().string(), Mnist::Mode::kTest);
  auto x = data::transforms::Normalize<>(0.1307, 0.3081)(raw.images());
  const Trained own_path = train(hasten::DataLoader(hasten::TensorDataset(x, raw.targets()), options));

  EXPECT_GT(torch_path.first_loss, 0.3);
  EXPECT_LT(torch_path.last_epoch_loss, 0.05);
  EXPECT_EQ(torch_path.first_indices, own_path.first_indices);
  ASSERT_EQ(torch_path.parameters.size(), own_path.parameters.size());
  for (size_t i = 0; i < own_path.parameters.size(); ++i)
    EXPECT_LE((torch_path.parameters[i] - own_path.parameters[i]).abs().max().item<double>(), 1e-6);

  // The trained model separates the classes.
  torch::NoGradGuard no_grad;
  auto logits = torch::matmul(x.flatten(1), torch_path.parameters[0].t()) + torch_path.parameters[1];
  const double accuracy = logits.argmax(1).eq(raw.targets()).to(torch::kDouble).mean().item<double>();
  EXPECT_GT(accuracy, 0.99);
}

TEST(TorchDatasets, MnistWithoutTransformsIsStackedByTheLoader) {
  hasten::test::TempDir dir;
  write_mnist(dir.path());
  Mnist raw(dir.path().string(), Mnist::Mode::kTest);
  hasten::DataLoader loader(raw, {.batch_size = 100});
  EXPECT_EQ(loader.size(), 100u);
  auto it = loader.begin();
  hasten::ExampleBatch& batch = *it;
  EXPECT_TRUE(torch::equal(batch.data, raw.images().narrow(0, 0, 100)));
  EXPECT_TRUE(torch::equal(batch.target, raw.targets().narrow(0, 0, 100)));
  EXPECT_EQ(batch.size(), 100);
}

TEST(TorchDatasets, AUsersDatasetWorksWithAndWithoutStack) {
  hasten::DataLoader plain(Numbers(7), {.batch_size = 3});
  hasten::DataLoader stacked(Numbers(7).map(data::transforms::Stack<>()), {.batch_size = 3});
  auto check = [](auto& loader) {
    std::vector<int64_t> sizes;
    for (auto& batch : loader) {
      const data::Example<>& example = batch;  // usable where LibTorch code expects an Example<>
      auto i = batch.indices.to(torch::kFloat);
      EXPECT_TRUE(torch::equal(example.data, torch::stack({i, -i}, 1)));
      EXPECT_TRUE(torch::equal(example.target, batch.indices));
      EXPECT_EQ(batch.num_padding, 0);
      EXPECT_TRUE(batch.real_mask().all().template item<bool>());
      sizes.push_back(batch.size());
    }
    EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 1}));
  };
  check(plain);
  check(stacked);

  // And through prepare, shuffled: the same batches as hasten's own loader.
  Accelerator acc(isolated());
  const hasten::DataLoaderOptions options{.batch_size = 3, .shuffle = true, .seed = 9};
  hasten::DataLoader mine(Numbers(7).map(data::transforms::Stack<>()), options);
  hasten::DataLoader own(numbers_tensors(7), options);
  auto [a, b] = acc.prepare(mine, own);
  std::vector<std::vector<int64_t>> from_torch, from_own;
  for (auto& batch : a) from_torch.push_back(as_vector(batch.indices));
  for (auto& batch : b) from_own.push_back(as_vector(batch.indices));
  EXPECT_EQ(from_torch, from_own);
  EXPECT_NE(from_torch.front(), (std::vector<int64_t>{0, 1, 2}));  // shuffled
}

TEST(TorchDatasets, ResumeMidEpochAsWithHastensOwnLoader) {
  hasten::test::TempDir dir;
  const hasten::DataLoaderOptions options{.batch_size = 3, .shuffle = true, .seed = 5};
  const auto mine = resumed(hasten::DataLoader(Numbers(10).map(data::transforms::Stack<>()), options), dir.path() / "a");
  const auto own = resumed(hasten::DataLoader(numbers_tensors(10), options), dir.path() / "b");
  EXPECT_EQ(mine, own);
  EXPECT_EQ(mine.size(), 6u);  // the two unseen batches of the first epoch, then all 4 of the next
}

TEST(TorchDatasets, ABatchOfTheWrongSizeIsAnError) {
  // A transform that drops samples would break padding and gather_for_metrics.
  struct Halving : data::transforms::BatchTransform<std::vector<data::Example<>>, data::Example<>> {
    data::Example<> apply_batch(std::vector<data::Example<>> examples) override {
      examples.resize(examples.size() / 2);
      return data::transforms::Stack<>().apply_batch(std::move(examples));
    }
  };
  hasten::DataLoader loader(Numbers(8).map(Halving()), {.batch_size = 4});
  EXPECT_THROW(*loader.begin(), hasten::Error);
}

TEST(TorchDatasets, RanksGetTheShardsOfHastensOwnLoader) {
  // 10 samples, batch 3, 3 ranks: two rounds, the second padded with 8 repeated samples.
  hasten::launch(
      [] {
        Accelerator acc;
        const hasten::DataLoaderOptions options{.batch_size = 3, .shuffle = true, .seed = 11};
        hasten::DataLoader mine(Numbers(10), options);
        hasten::DataLoader own(numbers_tensors(10), options);
        auto [a, b] = acc.prepare(mine, own);
        require(a.size() == b.size() && a.size() == 2, "2 batches per rank, got " + std::to_string(a.size()));
        for (int epoch = 0; epoch < 2; ++epoch) {
          std::vector<torch::Tensor> indices, paddings, reals;
          for (auto& batch : a) {
            indices.push_back(batch.indices);
            paddings.push_back(torch::tensor({batch.num_padding}));
            reals.push_back(batch.real_mask().to(torch::kLong));  // gather takes numbers
            auto i = batch.indices.to(torch::kFloat);
            require(torch::equal(batch.data, torch::stack({i, -i}, 1)), "data of the indices");
          }
          size_t k = 0;
          for (auto& batch : b) {
            require(k < indices.size(), "as many batches");
            require(torch::equal(batch.indices, indices[k]), "epoch " + std::to_string(epoch) + " batch " +
                                                                 std::to_string(k) + ": " + c10::str(indices[k]) +
                                                                 " vs hasten's " + c10::str(batch.indices));
            require(batch.num_padding == paddings[k].item<int64_t>(), "the same padding");
            ++k;
          }
          // Every rank's real samples together: the dataset, each sample once.
          auto all = acc.gather(torch::cat(indices));
          auto real = acc.gather(torch::cat(reals));
          auto seen = std::get<0>(all.masked_select(real.to(torch::kBool)).sort());
          require(torch::equal(seen, torch::arange(10)), "the ranks' shares partition the dataset: " + c10::str(seen));
          require(acc.reduce(torch::cat(paddings)).sum().item<int64_t>() == 8, "8 samples of padding in all");
        }
      },
      with_ranks(3));
}

TEST(TorchDatasets, PaddingAndGatherForMetricsAsWithHastensOwnLoader) {
  // 9 samples, batch 5, 2 ranks: rank 1's batch is padded with one repeated sample.
  hasten::launch(
      [] {
        Accelerator acc;
        hasten::DataLoader mine(Numbers(9).map(data::transforms::Stack<>()), {.batch_size = 5});
        hasten::DataLoader own(numbers_tensors(9), {.batch_size = 5});
        auto [a, b] = acc.prepare(mine, own);
        std::vector<int64_t> pad_torch, pad_own;
        std::vector<torch::Tensor> per_batch, epoch_torch, epoch_own;
        for (auto& batch : a) {
          pad_torch.push_back(batch.num_padding);
          per_batch.push_back(acc.gather_for_metrics(batch.target));
        }
        for (auto& batch : b) pad_own.push_back(batch.num_padding);
        require(pad_torch == pad_own, "the same padding as hasten's own loader");
        require(pad_torch == std::vector<int64_t>{acc.process_index() == 1 ? 1 : 0}, "rank 1 has the padding");
        require(per_batch.size() == 1 && torch::equal(per_batch[0], torch::arange(9)),
                "gather_for_metrics per batch: " + c10::str(per_batch[0]));
        // After a whole epoch, its outputs concatenated: the padding is dropped once.
        for (auto& batch : a) epoch_torch.push_back(batch.target * 10);
        auto torch_all = acc.gather_for_metrics(torch::cat(epoch_torch));
        for (auto& batch : b) epoch_own.push_back(batch.target * 10);
        auto own_all = acc.gather_for_metrics(torch::cat(epoch_own));
        require(torch::equal(torch_all, own_all) && torch_all.numel() == 9,
                "epoch-level gather_for_metrics: " + c10::str(torch_all) + " vs " + c10::str(own_all));
      },
      with_ranks(2));
}
