// A unit whose weights stay on disk, or in CPU memory while it runs on a GPU (big-model
// inference, hasten/big_modeling.hpp): before each forward its parameters and buffers are read
// from the checkpoint (or copied from their CPU copies) into fresh storage on the unit's device,
// after it they are dropped again (0-element tensors of their dtype), so that of all such units
// only the running one's weights are on its device.
#pragma once

#include <hasten/unit.hpp>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace hasten::detail {

// A weights file, open from dispatch on: every later read is of the file that was checked then,
// even when a new one is renamed into its place.
class WeightFile {
 public:
  explicit WeightFile(std::filesystem::path path);  // Error naming it when it cannot be opened
  ~WeightFile();
  WeightFile(const WeightFile&) = delete;
  WeightFile& operator=(const WeightFile&) = delete;
  const std::filesystem::path& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

// Where one tensor of a safetensors file is.
struct StoredTensor {
  std::shared_ptr<const WeightFile> file;
  torch::ScalarType dtype = torch::kFloat;  // as stored
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // of its first byte in the file
  uint64_t bytes = 0;
};

// EmptyWeights (big_modeling.hpp), for unit_built: whether one lives on this thread, and a
// unit's weights dropped with their shapes remembered; declared_shape gives a tensor's shape
// before it was emptied (else its own).
bool empty_weights_active();
void empty_unit_weights(torch::nn::Module& unit);
std::vector<int64_t> declared_shape(const torch::Tensor& t);

// Gives the pages of freed memory back to the system (weights dropped).
void release_freed_memory();

// The tensor's values as a new CPU tensor of `dtype` (converted when stored otherwise). Error
// naming `name` and the file when it cannot be read.
torch::Tensor read_stored(const StoredTensor& stored, torch::ScalarType dtype, const std::string& name);

class UnitStream {
 public:
  // One of the unit's parameters or buffers (the tensor shares the module's TensorImpl, so
  // set_data on it is the module's) and where its values are: in the checkpoint (`stored`), or,
  // offloaded, in `host`, a CPU tensor of the module's dtype.
  struct Slot {
    std::string name;
    torch::Tensor tensor;
    StoredTensor stored;
    torch::Tensor host;
  };
  // `device`: where the unit runs, its weights read in there.
  UnitStream(std::string unit_name, std::vector<Slot> slots, torch::Device device);
  // The unit streams its weights from now on; its tensors hold none until its next forward.
  static void attach(UnitBase& unit, const std::shared_ptr<UnitStream>& stream);
  static bool attached(const UnitBase& unit) { return unit.stream_ != nullptr; }
  // The unit runs on `device`: its forward's tensor arguments are moved there (UnitBase::hasten_device).
  static void run_on(UnitBase& unit, torch::Device device) { unit.device_ = device; }
  // Before the unit's forward: every slot read in (UsageError with autograd on: the weights
  // would be gone before backward needs them). One forward at a time: the unit's tensors are
  // shared by every thread that calls it.
  void read_in();
  // After it: every slot emptied.
  void drop();

 private:
  std::string unit_name_;
  std::vector<Slot> slots_;
  torch::Device device_;
};

}  // namespace hasten::detail
