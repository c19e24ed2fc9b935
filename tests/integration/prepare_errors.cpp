// Programs that must not compile, one per HASTEN_CASE, each refused by one static_assert that
// says what to do, printed as the compiler's first error (test_prepare_errors.py). Without a
// case the file compiles: the correct spellings of the same programs.
#include <hasten/hasten.hpp>

#include <torch/torch.h>

namespace data = torch::data;

namespace {

struct Numbers : data::datasets::Dataset<Numbers> {
  data::Example<> get(size_t i) override { return {torch::ones({2}) * static_cast<double>(i), torch::tensor(0)}; }
  torch::optional<size_t> size() const override { return 8; }
};

// Stateful, like ChunkDataset: batches come from a stream until it is empty.
struct Chunks : data::datasets::BatchDataset<Chunks, torch::optional<std::vector<data::Example<>>>, size_t> {
  torch::optional<std::vector<data::Example<>>> get_batch(size_t) override { return torch::nullopt; }
  torch::optional<size_t> size() const override { return 8; }
  void reset() {}
};

// A stream: a request is a count, not indices.
struct Stream : data::datasets::StreamDataset<Stream> {
  std::vector<data::Example<>> get_batch(size_t n) override { return std::vector<data::Example<>>(n); }
  torch::optional<size_t> size() const override { return 8; }
};

}  // namespace

int main() {
  hasten::Accelerator acc;
  const auto options = data::DataLoaderOptions().batch_size(4);
#if !defined(HASTEN_CASE)
  hasten::DataLoader loader(Numbers().map(data::transforms::Stack<>()), {.batch_size = 4});
  auto prepared = acc.prepare(loader);
  for (auto& batch : prepared) (void)batch.data;
  (void)options;
  (void)Chunks().size();
  (void)Stream().size();
#elif HASTEN_CASE == 1  // make_data_loader's result
  auto prepared = acc.prepare(data::make_data_loader(Numbers().map(data::transforms::Stack<>()), options));
#elif HASTEN_CASE == 2  // the loader itself
  auto loader = data::make_data_loader(Numbers(), options);
  auto prepared = acc.prepare(*loader);
#elif HASTEN_CASE == 3  // a bare LibTorch dataset
  auto prepared = acc.prepare(Numbers().map(data::transforms::Stack<>()));
#elif HASTEN_CASE == 4  // a stateful dataset
  hasten::DataLoader loader(Chunks(), {.batch_size = 4});
  auto prepared = acc.prepare(loader);
#elif HASTEN_CASE == 5  // a stream dataset
  hasten::DataLoader loader(Stream(), {.batch_size = 4});
  auto prepared = acc.prepare(loader);
#elif HASTEN_CASE == 6  // a LibTorch loader given to hasten::DataLoader
  hasten::DataLoader loader(data::make_data_loader(Numbers(), options), {.batch_size = 4});
  auto prepared = acc.prepare(loader);
#endif
  (void)prepared;
}
