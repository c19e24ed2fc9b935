// The reading of one checkpoint by load_state (checkpoint_load.cpp: the phases, models and the
// rest; optimizer_load.cpp: the optimizer phase). Internal to the checkpoint subsystem.
#pragma once

#include <hasten/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/engine_state.hpp"

namespace hasten::detail {

// One checkpoint, read once: every rank reads only the files it needs, each front to back,
// verifying its checksum as the bytes arrive (checkpoint_reader.cpp). Nothing but parameters
// and optimizer state tensors changes until every rank has read and verified all it needs; a
// damaged file (CorruptCheckpointFile, on every rank alike) then leaves the rest untouched and
// the caller may load another checkpoint, which overwrites those tensors.
//
// The phases: check (the state file against what this program prepared, alike on every rank),
// then models, optimizers (one at a time) and the rest (read and verified), each ended by every
// rank agreeing that none failed, then apply, which changes the rest of the state.
class Engine::Impl::CheckpointLoad {
 public:
  CheckpointLoad(Engine& engine, Impl& s, const std::filesystem::path& dir);

  void run();

 private:
  // Refuses a checkpoint of another program (counts, optimizer types, dataset sizes) before
  // anything is read but the state file; every rank decides alike from the same file.
  void check() const;
  void check_machine_copy() const;  // save_on_each_node: this machine's copy holds this rank's files

  std::string layout(size_t optimizer) const;

  // A failure on one rank is every rank's: each phase ends with all ranks agreeing, before
  // anything collective runs, so that no rank waits for one that stopped. attempt() runs a
  // part of a phase unless this rank already failed in it; agree() ends the phase.
  void attempt(const std::function<void()>& fn);
  void agree();
  bool any_rank(bool mine);

  // Models. Unsharded: straight into the parameters and buffers where they can take the bytes
  // as they are. Sharded: only the ranges the strategy keeps where it can say which (ABI 1.5),
  // else full tensors, which the strategy slices (any number of ranks).
  void load_models();

  // Each rank reads only the ranges its strategy keeps, verifying the chunks it touches; the
  // names are checked here, the shapes as the strategy asks.
  void read_model_ranges(size_t i);

  void read_model_in_place(size_t i);

  // Optimizer i: LibTorch's archive as it was saved; the portable layout from this rank's own
  // pieces where they cover what it holds now, else assembled from every saved rank's pieces.
  void load_optimizer(size_t i);

  // This rank's own pieces (the file of rank 0 when the state is not sharded, or when this
  // rank held none), read into the live state tensors when the optimizer has them in that
  // layout already, else into new full-size tensors of which only this rank's range is ever
  // touched. read_names gets the names of the pieces read.
  void read_own_pieces(size_t i, std::set<std::string>& read_names);

  // Every saved rank's pieces, assembled and re-sliced for this run's ranks and strategy.
  void read_all_pieces(size_t i);

  // Full optimizer state tensors of model m: the strategy keeps its slice, or, without one
  // that shards optimizer state, they are the state.
  void set_state(torch::optim::Optimizer& optimizer, size_t m, const NamedTensors& full);

  // The rest is read (and verified) before any of it is applied.
  void read_rest();

  // The gradients model i had accumulated in a window that the save interrupted (none when
  // it saved at a window's end).
  NamedTensors read_gradients(size_t i) const;

  // Everything is verified: the rest of the state changes now. Schedulers first: replaying
  // their steps moves the learning rate, which is then set to exactly what was saved.
  void apply();

  // The window's gradients as .grad, which the strategy takes into its buffers at the next
  // backward.
  void apply_gradients(size_t i);

  // The precision plugin's state (a loss scaler's), where the checkpoint has this precision's.
  void restore_precision();

  Engine& engine_;
  Impl& s_;
  const std::filesystem::path dir_;
  nlohmann::json manifest_;  // set by the constructor (or failure_ says why not)
  nlohmann::json state_;
  const int rank_, world_;
  const bool sharded_;
  int saved_world_ = 1;
  bool same_layout_ = false;  // the same number of ranks under the same strategy
  std::string failure_;       // this rank's in the current phase: "corrupt:<line>" or "error:<line>"
  // "<m>:<param>" -> its number of elements as saved (a sharding strategy's parameters may be
  // freed, empty tensors, at rest): the size of each full optimizer state tensor.
  std::map<std::string, int64_t> saved_numel_;
  // Read by read_rest, applied by apply.
  NamedTensors rng_;
  std::vector<NamedTensors> grads_;
  std::vector<NamedTensors> custom_tensors_;
  std::vector<std::string> custom_bytes_;
};

}  // namespace hasten::detail
