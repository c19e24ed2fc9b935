// Which datasets and loaders are which, at compile time: hasten-style (size() and get or
// get_batch), LibTorch's map-style datasets and loaders, stream datasets (next/reset). Not part
// of the API: included by data.hpp's templates.
#pragma once

#include <hasten/batch.hpp>

#include <torch/data/dataloader/base.h>
#include <torch/data/example.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace hasten::detail {

template <class T, class = void>
struct has_get_batch : std::false_type {};
template <class T>
struct has_get_batch<T, std::void_t<decltype(std::declval<const T&>().get_batch(
                            std::declval<const std::vector<int64_t>&>()))>> : std::true_type {};
template <class T, class = void>
struct has_get : std::false_type {};
template <class T>
struct has_get<T, std::void_t<decltype(std::declval<T&>().get(size_t{}))>> : std::true_type {};
// get(size_t) gives named tensors (hasten::TensorDict) rather than a torch::data::Example<>.
template <class T, class = void>
struct get_returns_sample : std::false_type {};
template <class T>
struct get_returns_sample<T, std::void_t<decltype(std::declval<T&>().get(size_t{}))>>
    : std::is_convertible<decltype(std::declval<T&>().get(size_t{})), TensorDict> {};
template <class T, class = void>
struct has_size : std::false_type {};
template <class T>
struct has_size<T, std::void_t<decltype(std::declval<const T&>().size())>> : std::true_type {};

// LibTorch's datasets (torch::data::datasets::BatchDataset and everything derived from it,
// .map() results included) name their batch and request types and say whether they are
// stateful; hasten-style datasets do not.
template <class T, class = void>
struct is_torch_dataset : std::false_type {};
template <class T>
struct is_torch_dataset<T, std::void_t<typename T::BatchType, typename T::BatchRequestType,
                                       decltype(T::is_stateful)>> : std::true_type {};
template <class T>
constexpr bool is_torch_dataset_v = is_torch_dataset<T>::value;

// Map-style: not stateful (a stateful one's BatchType is an optional: ChunkDataset) and
// indexed by positions (a StreamDataset's request is a count).
template <class T, bool = is_torch_dataset_v<T>>
struct is_torch_map_dataset : std::false_type {};
template <class T>
struct is_torch_map_dataset<T, true>
    : std::bool_constant<!T::is_stateful &&
                         std::is_constructible_v<typename T::BatchRequestType, c10::ArrayRef<size_t>>> {};

// LibTorch's data loaders (what torch::data::make_data_loader returns, behind its pointer).
template <class D, class B, class R>
std::true_type derives_from_torch_loader(const torch::data::DataLoaderBase<D, B, R>*);
std::false_type derives_from_torch_loader(const void*);
template <class T>
struct is_torch_loader : decltype(derives_from_torch_loader(std::declval<const T*>())) {};
template <class T>
struct is_torch_loader<std::unique_ptr<T>> : is_torch_loader<T> {};
template <class T>
struct is_torch_loader<std::shared_ptr<T>> : is_torch_loader<T> {};
template <class T>
constexpr bool is_torch_loader_v = is_torch_loader<std::decay_t<T>>::value;

template <class T>
constexpr bool is_hasten_dataset_v =
    !is_torch_dataset_v<T> && has_size<T>::value && (has_get_batch<T>::value || has_get<T>::value);

// A stream (iterable) dataset: next() gives the next sample or none at the end, reset()
// starts the stream over; set_epoch(int64_t), if it has one, is told each epoch first.
template <class T, class = void>
struct has_next : std::false_type {};
template <class T>
struct has_next<T, std::void_t<decltype(std::declval<T&>().next())>>
    : std::is_convertible<decltype(std::declval<T&>().next()), std::optional<torch::data::Example<>>> {};
template <class T, class = void>
struct has_reset : std::false_type {};
template <class T>
struct has_reset<T, std::void_t<decltype(std::declval<T&>().reset())>> : std::true_type {};
template <class T, class = void>
struct has_set_epoch : std::false_type {};
template <class T>
struct has_set_epoch<T, std::void_t<decltype(std::declval<T&>().set_epoch(int64_t{}))>> : std::true_type {};
template <class T>
constexpr bool is_stream_dataset_v =
    !is_torch_dataset_v<T> && !is_hasten_dataset_v<T> && has_next<T>::value && has_reset<T>::value;

// What hasten::DataLoader can load (it refuses the rest with a static_assert).
template <class T>
constexpr bool is_loadable_v = is_torch_map_dataset<T>::value || is_hasten_dataset_v<T> || is_stream_dataset_v<T>;

// The batch a loader over Dataset yields: LibTorch's datasets keep LibTorch's names.
template <class Dataset>
using batch_t = std::conditional_t<is_torch_dataset_v<Dataset>, ExampleBatch, Batch>;

}  // namespace hasten::detail
