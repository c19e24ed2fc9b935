// dispatch_batches: rank 0's round broadcast to every rank, and each rank's slice of it
// (Accelerate's DataLoaderDispatcher, whose arithmetic dispatch_slice in data_loader.cpp keeps).
#include <hasten/detail/dispatch.hpp>
#include <hasten/error.hpp>

#include <torch/torch.h>

#include <sstream>
#include <string>

namespace hasten::detail {

namespace {

// A tensor's description in the round's header: whether it is there, its dtype and sizes.
void describe(std::ostringstream& out, const torch::Tensor& t) {
  if (!t.defined()) {
    out << " 0";
    return;
  }
  out << " 1 " << static_cast<int>(t.scalar_type()) << " " << t.dim();
  for (auto s : t.sizes()) out << " " << s;
}

// The tensor a receiving rank fills: undefined when rank 0's is.
torch::Tensor allocate(std::istringstream& in) {
  int defined = 0;
  in >> defined;
  if (!defined) return {};
  int dtype = 0;
  int64_t dims = 0;
  in >> dtype >> dims;
  std::vector<int64_t> sizes(static_cast<size_t>(dims));
  for (auto& s : sizes) in >> s;
  return torch::empty(sizes, torch::TensorOptions().dtype(static_cast<torch::ScalarType>(dtype)));
}

torch::Tensor cat_rows(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined()) return a;
  return torch::cat({a, b}, 0);
}

torch::Tensor rows_of(const torch::Tensor& t, const DispatchSlice& s) {
  return t.defined() ? t.narrow(0, s.begin, s.end - s.begin) : t;
}

}  // namespace

DispatchRound concat_batches(const std::vector<DispatchRound>& batches) {
  if (batches.size() == 1) return batches.front();
  std::vector<torch::Tensor> data, target, indices;
  for (const auto& b : batches) {
    data.push_back(b.data);
    if (b.target.defined()) target.push_back(b.target);
    indices.push_back(b.indices);
  }
  if (!target.empty() && target.size() != batches.size())
    throw Error("DataLoader: dispatch_batches got batches with a target and batches without one");
  DispatchRound out;
  try {
    out.data = torch::cat(data, 0);
    if (!target.empty()) out.target = torch::cat(target, 0);
  } catch (const c10::Error&) {
    throw Error("DataLoader: dispatch_batches concatenates the batches of a round, and these differ in more than "
                "their number of samples; set dispatch_batches false (each process reads its own batches) or "
                "split_batches true (rank 0 reads one batch and splits it)");
  }
  out.indices = torch::cat(indices, 0);
  return out;
}

std::optional<DispatchedBatch> dispatch_round(Engine& engine, const EpochPlan& plan,
                                              const std::optional<DispatchRound>& round, bool last,
                                              const DispatchRound* first) {
  const int64_t world = plan.world_size;
  DispatchRound sent;
  std::string header = "end";
  if (plan.rank == 0 && round) {
    const int64_t observed = round->rows();
    int64_t first_rows = 0;
    sent = *round;
    if (last && !plan.drop_last && observed % world != 0) {
      // Accelerate's completion of the last round: the first rows of the epoch's first round.
      if (first == nullptr) throw Error("dispatch_batches: the last round has no first round to complete it");
      first_rows = std::min(world, first->rows());
      sent.data = cat_rows(sent.data, first->data.narrow(0, 0, first_rows));
      sent.target = cat_rows(sent.target, first->target.defined() ? first->target.narrow(0, 0, first_rows)
                                                                  : first->target);
      sent.indices = torch::cat({sent.indices, first->indices.narrow(0, 0, first_rows)}, 0);
    }
    // The round travels on the CPU, contiguous (the receivers allocate it so).
    for (auto* t : {&sent.data, &sent.target, &sent.indices})
      if (t->defined()) *t = t->to(torch::kCPU).contiguous();
    std::ostringstream out;
    out << "round " << observed << " " << (last ? 1 : 0) << " " << first_rows;
    describe(out, sent.data);
    describe(out, sent.target);
    header = out.str();
  }
  header = engine.broadcast(header, 0);
  if (header == "end") return std::nullopt;
  std::istringstream in(header);
  std::string word;
  int64_t observed = 0, first_rows = 0;
  int is_last = 0;
  in >> word >> observed >> is_last >> first_rows;
  if (plan.rank != 0) {
    sent.data = allocate(in);
    sent.target = allocate(in);
    sent.indices = torch::empty({observed + first_rows}, torch::kLong);
  }
  for (auto* t : {&sent.data, &sent.target, &sent.indices})
    if (t->defined()) engine.broadcast_(*t, 0);
  const DispatchSlice s = dispatch_slice(observed, is_last != 0, plan.drop_last, world, plan.rank, first_rows);
  DispatchedBatch mine;
  mine.data = rows_of(sent.data, s);
  mine.target = rows_of(sent.target, s);
  mine.indices = rows_of(sent.indices, s);
  mine.num_padding = s.padding;
  mine.last = is_last != 0;
  return mine;
}

}  // namespace hasten::detail
