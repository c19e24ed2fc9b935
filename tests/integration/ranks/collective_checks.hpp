// The collective suite every CPU comm plugin passes (gloo and shm in test_distributed.cpp under
// hasten::launch, mpi in test_mpi.cpp under mpirun): each operation and dtype against references
// computed locally, asynchronous operations in flight, and the utilities on top. The backend
// in use must be the one HASTEN_COMM names.
#pragma once

#include <hasten/hasten.hpp>

#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.hpp"

namespace hasten::test {

// Rank r's contribution: small integers, exact in every dtype.
inline torch::Tensor contribution(int rank, int64_t n, torch::ScalarType dtype) {
  return (torch::arange(n, torch::kLong) % 7 * (rank + 1) - rank * 3).to(dtype);
}

inline void all_operations_and_dtypes() {
  Accelerator acc;
  const int w = acc.num_processes(), r = acc.process_index();
  const std::string expected = std::getenv("HASTEN_COMM");
  require(acc.comm_backend() == expected, "the CPU backend is " + acc.comm_backend() + ", expected " + expected);
  const std::vector<torch::ScalarType> dtypes = {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf, torch::kLong,
                                                torch::kInt};
  const std::vector<std::pair<ReduceOp, const char*>> ops = {
      {ReduceOp::Sum, "sum"}, {ReduceOp::Avg, "avg"}, {ReduceOp::Min, "min"}, {ReduceOp::Max, "max"}};
  const int64_t n = 1000;
  for (auto dtype : dtypes) {
    std::vector<torch::Tensor> all;
    for (int k = 0; k < w; ++k) all.push_back(contribution(k, n, dtype).to(torch::kDouble));
    auto stacked = torch::stack(all);
    for (auto [op, name] : ops) {
      torch::Tensor expected;
      if (op == ReduceOp::Sum) expected = stacked.sum(0);
      if (op == ReduceOp::Avg) expected = stacked.sum(0) / w;
      if (op == ReduceOp::Min) expected = std::get<0>(stacked.min(0));
      if (op == ReduceOp::Max) expected = std::get<0>(stacked.max(0));
      if ((dtype == torch::kLong || dtype == torch::kInt) && op == ReduceOp::Avg)
        expected = stacked.sum(0).to(torch::kLong).div(w, "trunc");
      auto t = contribution(r, n, dtype);
      acc.all_reduce_(t, op).wait();
      const auto got = t.to(torch::kDouble);
      const auto want = expected.to(dtype).to(torch::kDouble);
      require(torch::equal(got, want), std::string("allreduce ") + name + " " + c10::toString(dtype) +
                                           " differs from the reference by " +
                                           std::to_string((got - want).abs().max().item<double>()));
    }
    // allgather: rank-major concatenation.
    auto gathered = acc.gather(contribution(r, 10, dtype));
    std::vector<torch::Tensor> parts;
    for (int k = 0; k < w; ++k) parts.push_back(contribution(k, 10, dtype));
    require(torch::equal(gathered, torch::cat(parts)), std::string("allgather ") + c10::toString(dtype));
    // reduce_scatter: slice r of the sum of everyone's input.
    auto rs = acc.reduce_scatter(contribution(r, 12 * w, dtype), ReduceOp::Sum);
    torch::Tensor sum = torch::zeros({12 * w}, torch::kDouble);
    for (int k = 0; k < w; ++k) sum += contribution(k, 12 * w, dtype).to(torch::kDouble);
    require(torch::equal(rs.to(torch::kDouble), sum.narrow(0, 12 * r, 12).to(dtype).to(torch::kDouble)),
            std::string("reduce_scatter ") + c10::toString(dtype));
    // broadcast from the last rank.
    auto b = contribution(r, 33, dtype);
    acc.broadcast_(b, w - 1);
    require(torch::equal(b, contribution(w - 1, 33, dtype)), std::string("broadcast ") + c10::toString(dtype));
  }
  // Several asynchronous operations in flight, then waited for.
  std::vector<torch::Tensor> ts;
  std::vector<hasten::Work> works;
  for (int i = 0; i < 8; ++i) ts.push_back(torch::full({1 << 12}, static_cast<float>(i + r)));
  for (auto& t : ts) works.push_back(acc.all_reduce_(t, ReduceOp::Sum));
  for (auto& wk : works) wk.wait();
  for (int i = 0; i < 8; ++i)
    require(ts[static_cast<size_t>(i)].eq(static_cast<float>(w * i + w * (w - 1) / 2)).all().item<bool>(), "async allreduce");
  acc.wait_for_everyone();
  // Utilities on top.
  require(acc.reduce(torch::tensor({1.0 * r}), "max").item<double>() == w - 1, "reduce max");
  require(acc.broadcast(std::string(r == 0 ? "from rank 0" : "other")) == "from rank 0", "broadcast string");
  auto padded = acc.pad_across_processes(torch::ones({r + 1, 2}), 0, -1.0);
  require(padded.size(0) == w && padded[0][0].item<double>() == 1.0, "pad_across_processes");
  if (r == w - 1) acc.set_trigger();
  require(acc.check_trigger(), "check_trigger sees the last rank's trigger");
  require(!acc.check_trigger(), "check_trigger resets");
  const auto share = acc.split_between_processes(std::vector<int>{1, 2, 3, 4, 5});
  require(!share.empty(), "split_between_processes");
}

}  // namespace hasten::test
