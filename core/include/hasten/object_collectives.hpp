// gather_object and broadcast_object_list: collectives on any value hasten::Serializer can
// write (hasten/serialization.hpp), carried as bytes in uint8 tensors over the run's CPU
// communicator. The Accelerator's methods of these names call them; every rank must call them,
// in the same order, with the same type.
#pragma once

#include <hasten/detail/engine.hpp>
#include <hasten/nested.hpp>
#include <hasten/serialization.hpp>

#include <torch/types.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace hasten::detail {

// Every rank's bytes, in rank order: the lengths first, then the bytes padded to the longest
// (so that every rank's tensor has one shape, as allgather and debug mode's check want).
inline std::vector<std::string> gather_bytes(Engine& engine, const std::string& mine) {
  const torch::Tensor lengths = engine.gather(torch::tensor({static_cast<int64_t>(mine.size())}, torch::kLong));
  const int64_t longest = std::max<int64_t>(lengths.max().item<int64_t>(), 1);
  torch::Tensor buffer = torch::zeros({longest}, torch::kUInt8);
  if (!mine.empty()) std::memcpy(buffer.data_ptr(), mine.data(), mine.size());
  const torch::Tensor all = engine.gather(buffer);
  const auto* bytes = static_cast<const char*>(all.data_ptr());
  std::vector<std::string> out;
  for (int64_t r = 0; r < lengths.size(0); ++r)
    out.emplace_back(bytes + r * longest, static_cast<size_t>(lengths[r].item<int64_t>()));
  return out;
}

// A list: every rank's elements concatenated in rank order; anything else: every rank's
// object, in rank order.
template <class T>
auto gather_object(Engine& engine, const T& object) {
  const std::vector<std::string> parts = gather_bytes(engine, to_bytes(object));
  if constexpr (is_std_vector<T>::value) {
    T out;
    for (const auto& part : parts) {
      T theirs = from_bytes<T>(part);
      out.insert(out.end(), std::make_move_iterator(theirs.begin()), std::make_move_iterator(theirs.end()));
    }
    return out;
  } else {
    std::vector<T> out;
    out.reserve(parts.size());
    for (const auto& part : parts) out.push_back(from_bytes<T>(part));
    return out;
  }
}

// gather_for_metrics on a list of per-sample values that are not tensors (Accelerate gathers
// them with gather_object): every rank's list gathered, less the samples that pad the loader's
// last round. Which survive is decided by the tensor gather_for_metrics on each element's
// (rank, index), so objects and tensors drop exactly the same samples.
template <class T, class A>
std::vector<T, A> gather_objects_for_metrics(Engine& engine, const std::vector<T, A>& objects) {
  const std::vector<std::string> parts = gather_bytes(engine, to_bytes(objects));
  std::vector<std::vector<T, A>> lists;
  for (const auto& part : parts) lists.push_back(from_bytes<std::vector<T, A>>(part));
  for (size_t r = 1; r < lists.size(); ++r)
    if (lists[r].size() != lists[0].size())
      throw UsageError("gather_for_metrics: every rank must pass one value per sample of its batch (rank 0 has " +
                       std::to_string(lists[0].size()) + ", rank " + std::to_string(r) + " has " +
                       std::to_string(lists[r].size()) + ")");
  const auto n = static_cast<int64_t>(objects.size());
  const torch::Tensor ids = torch::stack(
      {torch::full({n}, static_cast<int64_t>(engine.process().rank), torch::kLong), torch::arange(n, torch::kLong)}, 1);
  const torch::Tensor kept = engine.gather_for_metrics(ids).contiguous();
  const int64_t* id = kept.data_ptr<int64_t>();
  std::vector<T, A> out;
  out.reserve(static_cast<size_t>(kept.size(0)));
  for (int64_t i = 0; i < kept.size(0); ++i)
    out.push_back(std::move(lists[static_cast<size_t>(id[2 * i])][static_cast<size_t>(id[2 * i + 1])]));
  return out;
}

// The source rank's list replaces the list on every rank (its length included).
template <class T, class A>
std::vector<T, A>& broadcast_object_list(Engine& engine, std::vector<T, A>& list, int from_process) {
  const std::string bytes = engine.broadcast(engine.process().rank == from_process ? to_bytes(list) : std::string(),
                                             from_process);
  if (engine.process().rank != from_process) list = from_bytes<std::vector<T, A>>(bytes);
  return list;
}

}  // namespace hasten::detail
