// Seeding: LibTorch's and the C library's generators, per process or per rank; and
// synchronize_rng_states, which gives every rank rank 0's generator states.
#include <hasten/detail/engine.hpp>
#include <hasten/error.hpp>
#include <hasten/process.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <cstdlib>
#include <mutex>

namespace hasten {

void set_seed(uint64_t seed, bool device_specific) {
  uint64_t s = seed;
  if (device_specific) s += static_cast<uint64_t>(detect_process_info(current_environment()).rank);
  torch::manual_seed(s);
  std::srand(static_cast<unsigned>(s));
}

namespace {

// Rank 0's state of `gen`, set on every rank (Accelerate's synchronize_rng_state broadcasts
// from rank 0 whatever from_process other collectives use).
void synchronize(detail::Engine& engine, at::Generator gen) {
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  state = engine.broadcast(state, 0);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

void detail::Engine::synchronize_rng_states(const std::vector<std::string>& rng_types, torch::Generator generator) {
  // Every name is checked before the first collective, so a bad list fails alike on every rank.
  for (const auto& type : rng_types) {
    if (type == "generator") {
      if (!generator.defined())
        throw UsageError("synchronize_rng_states: 'generator' needs a generator (the second argument)");
    } else if (type == "cuda") {
      if (!device().is_cuda())
        throw UsageError("synchronize_rng_states: 'cuda' needs a process on a CUDA device (this one is on " +
                         device().str() + ")");
    } else if (type != "torch") {
      throw UsageError("synchronize_rng_states: rng type '" + type + "' is not allowed (allowed: torch, cuda, generator)");
    }
  }
  for (const auto& type : rng_types) {
    if (type == "torch")
      synchronize(*this, at::detail::getDefaultCPUGenerator());
    else if (type == "cuda")
      synchronize(*this, at::globalContext().defaultGenerator(device()));
    else
      synchronize(*this, generator);
  }
}

}  // namespace hasten
