// Streamed units (unit_stream.hpp): reading a stored tensor by its offset, and a unit's weights
// in for its forward (from disk or from their CPU copies) and out after.
#include "offload/unit_stream.hpp"

#include <hasten/error.hpp>

#include <torch/torch.h>

#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <utility>

#include <cerrno>
#include <cstring>

#include "formats/tensor_bytes.hpp"

namespace hasten::detail {

WeightFile::WeightFile(std::filesystem::path path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error("cannot open '" + path_.string() + "': " + std::strerror(errno));
}

WeightFile::~WeightFile() {
  if (fd_ >= 0) ::close(fd_);
}

torch::Tensor read_stored(const StoredTensor& stored, torch::ScalarType dtype, const std::string& name) {
  const int fd = stored.file->fd();
  const ReadAt read = [fd, &stored, &name](void* dst, uint64_t n, uint64_t offset) {
    auto* out = static_cast<char*>(dst);
    for (uint64_t done = 0; done < n;) {
      const ssize_t got = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        throw Error("cannot read '" + name + "' from '" + stored.file->path().string() + "': " + std::strerror(errno));
      if (got == 0) return false;
      done += static_cast<uint64_t>(got);
    }
    return true;
  };
  torch::Tensor t = read_tensor_bytes(read, stored.dtype, stored.shape, stored.offset, stored.bytes,
                                      "'" + stored.file->path().string() + "': ", name);
  return dtype == stored.dtype ? t : t.to(dtype);
}

UnitStream::UnitStream(std::string unit_name, std::vector<Slot> slots, torch::Device device)
    : unit_name_(std::move(unit_name)), slots_(std::move(slots)), device_(device) {}

void UnitStream::attach(UnitBase& unit, const std::shared_ptr<UnitStream>& stream) {
  unit.stream_ = stream;
  stream->drop();
}

void UnitStream::read_in() {
  if (torch::GradMode::is_enabled())
    throw UsageError("'" + unit_name_ +
                     "' streams its weights from disk or the CPU (load_checkpoint_and_dispatch), for inference: run the "
                     "forward under torch::NoGradGuard (its weights are dropped before a backward could use them)");
  torch::NoGradGuard no_grad;
  try {
    bool from_disk = false;
    for (auto& s : slots_) {
      from_disk = from_disk || !s.host.defined();
      torch::Tensor values = s.host.defined() ? s.host : read_stored(s.stored, s.tensor.scalar_type(), s.name);
      s.tensor.set_data(values.to(device_));
    }
    if (from_disk && !device_.is_cpu()) release_freed_memory();  // the values read, copied to the GPU
  } catch (...) {
    drop();  // the slots read so far are not left loaded
    throw;
  }
}

void UnitStream::drop() {
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) s.tensor.set_data(torch::empty({0}, s.tensor.options().device(device_)));
  if (device_.is_cpu()) release_freed_memory();  // on a GPU, the caching allocator keeps its blocks
}

void release_freed_memory() {
  // glibc keeps freed blocks below its mmap threshold (which it raises up to 32 MiB as large
  // blocks are freed) in the heap: a unit's weights, freed, would stay resident, and the next
  // unit's land elsewhere. malloc_trim hands the free pages back to the system.
  ::malloc_trim(0);
}

}  // namespace hasten::detail
