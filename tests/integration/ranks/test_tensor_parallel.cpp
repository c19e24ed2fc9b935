// Tensor parallelism (hasten/tensor_parallel.hpp) against one process, in forked ranks: the char
// LM's model (TinyGpt) split over tp = 2 by its plan (apps/examples/tp_gpt.hpp), prepared under
// ddp, trains 50 AdamW steps to the losses the one-process model has on the same batches, within
// 1e-5, alone (tp 2) and with data parallelism (dp 2 x tp 2 on 4 processes, clipping the
// gradient norm, which is the whole model's); its split layers hold 1/tp of the parameters; a
// prepared loader gives both ranks of a tp group the same samples and gather_for_metrics
// gathers over dp; a checkpoint of a tp 2 run holds whole tensors under TinyGpt's names and
// resumes in the plain one-process model, whose checkpoint resumes on dp 2 x tp 2, each with the
// losses of the straight run; a packed column-parallel layer gathers whole in the packed order;
// the vocabulary-parallel loss's Sum and None reductions and the infinity-norm clip equal one
// process's;
// zero/fsdp, full_model, join_uneven_inputs and dispatch_batches refuse a tensor-parallel mesh in
// one line.
#include <hasten/hasten.hpp>
#include <hasten/tensor_parallel.hpp>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "mesh_checks.hpp"
#include "test_util.hpp"
#include "tp_gpt.hpp"

using hasten::Accelerator;
using hasten::test::mesh_options;
using hasten::test::require;
using hasten::test::with_ranks;
using hasten::workloads::TinyGptImpl;
using hasten::workloads::TpGpt;

namespace {

constexpr int64_t kVocab = 96, kSeq = 32, kWidth = 64, kHeads = 4, kFf = 256, kLayers = 2, kBatch = 4, kSteps = 50;

std::shared_ptr<TinyGptImpl> build() {
  torch::manual_seed(0);
  return std::make_shared<TinyGptImpl>(kVocab, kSeq, kWidth, kHeads, kFf, kLayers, false);
}

// Step `step`'s global batch: `rows` sequences of kSeq + 1 tokens.
torch::Tensor tokens(int64_t step, int64_t rows) {
  torch::manual_seed(1000 + step);
  return torch::randint(0, kVocab, {rows, kSeq + 1}, torch::kLong);
}

// The one-process model's losses on the global batches of `rows` sequences, and (clip > 0) its
// gradient norms before clipping to `clip`.
std::pair<std::vector<double>, std::vector<double>> reference_losses(int64_t rows, double clip) {
  auto net = build();
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
  std::vector<double> losses, norms;
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto t = tokens(step, rows);
    auto loss = hasten::workloads::loss("gpt-tiny", net->forward(t.narrow(1, 0, kSeq).t()), t.narrow(1, 1, kSeq));
    adamw.zero_grad();
    loss.backward();
    if (clip > 0) norms.push_back(torch::nn::utils::clip_grad_norm_(net->parameters(), clip));
    adamw.step();
    losses.push_back(loss.item<double>());
  }
  return {losses, norms};
}

// Trains TinyGpt split over the mesh's tp group, each dp rank on its part of the global batch,
// and checks every step's loss (averaged over dp) against the one-process model's; with
// clip > 0 every step clips the gradient norm (over the whole model: its parts summed over
// tp), which must equal the one-process model's and exceed `clip` on some steps.
void train_split(int dp, int tp, double clip = 0) {
  Accelerator acc(mesh_options(dp, 1, tp));
  auto mesh = acc.device_mesh();
  const auto tp_group = mesh.group("tp"), dp_group = mesh.group("dp");
  require(tp_group.size() == tp && dp_group.size() == dp, "mesh sizes");
  const auto [want, want_norms] = reference_losses(kBatch * dp, clip);
  int clipped = 0;

  auto whole = build();
  TpGpt split(*whole, tp_group);
  // The split layers hold 1/tp of the whole ones' parameters.
  int64_t whole_split = 0, mine = 0;
  for (const auto& p : whole->named_parameters()) {
    const auto& n = p.key();
    if (n.find("norm") == std::string::npos && n != "pos.weight" && n.find("out_proj.bias") == std::string::npos &&
        n.find("linear2.bias") == std::string::npos)
      whole_split += p.value().numel();
  }
  for (const auto& p : split->named_parameters()) {
    const auto& n = p.key();
    if (n.find("norm") == std::string::npos && n != "pos.weight" && n.find("out_proj.bias") == std::string::npos &&
        n.find("linear2.bias") == std::string::npos)
      mine += p.value().numel();
  }
  require(mine * tp == whole_split, "the split layers hold " + std::to_string(mine) + " parameters, not 1/" +
                                        std::to_string(tp) + " of " + std::to_string(whole_split));
  whole.reset();

  torch::optim::AdamW adamw(split->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, opt] = acc.prepare(split.ptr(), adamw);
  double worst = 0, worst_norm = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto t = tokens(step, kBatch * dp).narrow(0, dp_group.rank() * kBatch, kBatch);
    auto logits = model(t.narrow(1, 0, kSeq).t());
    auto loss = split->loss(logits, t.narrow(1, 1, kSeq));
    acc.backward(loss);
    if (clip > 0) {
      // 1e-4: two runs that sum in different orders drift apart over the steps, and the norm
      // shows it before the loss (on AVX-512 kernels: steps 0-31 within 6e-7, later steps up to
      // 5e-5, while the losses stay within 1.2e-6); a norm that missed the parts' sum over tp, or
      // counted the replicated parameters twice, is off by percents.
      const double norm = acc.clip_grad_norm_(model, clip), ref = want_norms[static_cast<size_t>(step)];
      worst_norm = std::max(worst_norm, std::abs(norm - ref) / ref);
      require(std::abs(norm - ref) <= 1e-4 * ref, "step " + std::to_string(step) + ": gradient norm " +
                                                      std::to_string(norm) + ", one process " + std::to_string(ref));
      clipped += norm > clip ? 1 : 0;
    }
    opt.step();
    opt.zero_grad();
    auto mean = loss.detach().reshape({1}).clone();
    dp_group.all_reduce_(mean, hasten::ReduceOp::Avg);
    const double got = mean.item<double>(), ref = want[static_cast<size_t>(step)];
    worst = std::max(worst, std::abs(got - ref) / std::abs(ref));
    require(std::abs(got - ref) <= 1e-5 * std::abs(ref), "step " + std::to_string(step) + ": loss " + std::to_string(got) +
                                                             ", one process " + std::to_string(ref));
  }
  require(clip == 0 || clipped > 0, "the clip never bit: no gradient norm exceeded " + std::to_string(clip));
  if (acc.is_main_process())
    std::printf("tp %d x dp %d%s: %lld steps within %.3g relative of one process (last loss %.6f, clipped on %d, "
                "norms within %.3g)\n", tp, dp, clip > 0 ? " with clip_grad_norm_" : "", static_cast<long long>(kSteps), worst,
                want.back(), clipped, worst_norm);
  // Both ranks of a tp group hold the same replicated parameters (pos, norms) after training.
  auto pos = split->pos->weight.detach().clone();
  auto first = pos.clone();
  tp_group.broadcast_(first, 0);
  require(torch::equal(pos, first), "the replicated position embedding differs across the tp group");
}

// Checkpoints across tp sizes. One epoch of kResumeEnd global batches of kRows sequences, in
// order; each dp rank reads kRows / dp of each.
constexpr int64_t kRows = 8, kResumeEnd = 20;

hasten::TensorDataset epoch_of_batches() {
  std::vector<torch::Tensor> all;
  for (int64_t step = 0; step < kResumeEnd; ++step) all.push_back(tokens(step, kRows));
  torch::Tensor t = torch::cat(all);
  return hasten::TensorDataset(t, torch::arange(t.size(0)));
}

void write_losses(const std::filesystem::path& file, const std::map<int64_t, double>& losses) {
  std::ofstream out(file);
  char line[64];
  for (auto& [step, loss] : losses) {
    std::snprintf(line, sizeof line, "%lld %.17g\n", static_cast<long long>(step), loss);
    out << line;
  }
}

// Every resumed step's loss against the straight tp 2 run's, within 1e-5 relative.
void check_losses(const std::filesystem::path& file, const std::map<int64_t, double>& got, const std::string& what) {
  std::map<int64_t, double> want;
  std::ifstream in(file);
  long long step = 0;
  double loss = 0;
  while (in >> step >> loss) want[step] = loss;
  require(!got.empty(), what + ": no steps");
  double worst = 0;
  for (auto& [at, value] : got) {
    require(want.count(at) > 0, what + ": step " + std::to_string(at) + " is not in the straight run");
    const double ref = want[at];
    worst = std::max(worst, std::abs(value - ref) / std::abs(ref));
    require(std::abs(value - ref) <= 1e-5 * std::abs(ref), what + ": step " + std::to_string(at) + ": loss " +
                                                               std::to_string(value) + ", the straight run's " +
                                                               std::to_string(ref));
  }
  std::printf("%s: steps %lld..%lld within %.3g relative of the straight tp 2 run\n", what.c_str(),
              static_cast<long long>(got.begin()->first), static_cast<long long>(got.rbegin()->first), worst);
}

// TinyGpt split over the mesh dp x tp (at tp 1 the plain one-process model), trained on the
// prepared loader from the checkpoint `load` (when given) to the end of the epoch, saved into
// `save` after step `save_after` (when given). The losses (averaged over dp) of the steps it
// took, by step, checked against the straight run's in `losses` (with `what`), or written there
// by rank 0 when `what` is empty.
void train_checkpointed(int dp, int tp, const std::string& load, const std::string& save, int64_t save_after,
                        const std::filesystem::path& losses_file, const std::string& what) {
  Accelerator acc(mesh_options(dp, 1, tp));
  auto mesh = acc.device_mesh();
  std::shared_ptr<hasten::workloads::ModelImpl> net = build();
  TpGpt split{nullptr};
  if (tp > 1) {
    split = TpGpt(*std::static_pointer_cast<TinyGptImpl>(net), mesh.group("tp"));
    net = split.ptr();
  }
  auto loss_of = [&](const torch::Tensor& logits, const torch::Tensor& targets) {
    return tp > 1 ? split->loss(logits, targets) : hasten::workloads::loss("gpt-tiny", logits, targets);
  };
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [model, opt] = acc.prepare(net, adamw);
  hasten::DataLoader data(epoch_of_batches(), {.batch_size = kRows / dp});
  auto loader = acc.prepare(data);
  int64_t step = 0;
  if (!load.empty()) {
    acc.load_state(load);
    step = std::stoll(std::filesystem::path(load).filename().string().substr(6)) + 1;  // "after-N"
  }
  std::map<int64_t, double> losses;
  for (auto& batch : loader) {
    const torch::Tensor& t = batch.input;
    auto loss = loss_of(model(t.narrow(1, 0, kSeq).t()), t.narrow(1, 1, kSeq));
    acc.backward(loss);
    opt.step();
    opt.zero_grad();
    auto mean = loss.detach().reshape({1}).clone();
    mesh.group("dp").all_reduce_(mean, hasten::ReduceOp::Avg);
    losses[step] = mean.item<double>();
    if (step == save_after && !save.empty()) acc.save_state(save);
    ++step;
  }
  require(step == kResumeEnd, "the resumed loader ended at step " + std::to_string(step) + ", not " +
                                  std::to_string(kResumeEnd));
  if (!what.empty())
    check_losses(losses_file, losses, what);
  else if (acc.is_main_process())
    write_losses(losses_file, losses);
}

// A user's own tensor-parallel layer, clonable (hasten's are not): full_model refuses a model
// that holds split parts, whose clone would hold parts too.
struct HalfRowsImpl : torch::nn::Cloneable<HalfRowsImpl>, hasten::tp::SplitModule {
  explicit HalfRowsImpl(hasten::ProcessGroup g) : group(std::move(g)) { reset(); }
  void reset() override { weight = register_parameter("weight", torch::ones({1, 2})); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::linear(x, weight); }
  std::vector<hasten::tp::SplitParameter> split_parameters() const override { return {{"weight", 0}}; }
  const hasten::ProcessGroup& split_group() const override { return group; }
  hasten::ProcessGroup group;
  torch::Tensor weight;
};
TORCH_MODULE(HalfRows);

}  // namespace

TEST(TensorParallel, CheckpointResumesOnOtherTpSizes) {
  hasten::test::TempDir dir;
  const auto root = dir.path();
  const std::string a = (root / "after-9").string(), b = (root / "after-14").string();
  // tp 2 straight through, saving after step 9: whole tensors in the file.
  const auto straight = root / "straight.txt";
  hasten::launch([&] { train_checkpointed(1, 2, "", a, 9, straight, ""); },
      with_ranks(2, {{"HASTEN_COMM", "shm"}, {"HASTEN_STRATEGY", "ddp"}}, 300));
  auto saved = hasten::load_safetensors((std::filesystem::path(a) / "model.safetensors").string());
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& [name, t] : saved) shapes[name] = t.sizes().vec();
  ASSERT_EQ(shapes["tok.weight"], (std::vector<int64_t>{kVocab, kWidth}));
  ASSERT_EQ(shapes["layers.0.self_attn.in_proj_weight"], (std::vector<int64_t>{3 * kWidth, kWidth}));
  ASSERT_EQ(shapes["layers.1.self_attn.out_proj.weight"], (std::vector<int64_t>{kWidth, kWidth}));
  ASSERT_EQ(shapes["head.weight"], (std::vector<int64_t>{kVocab, kWidth}));
  // On one process, the plain TinyGpt (the names are its own): resumes with the straight run's
  // losses, and saves after step 14.
  hasten::launch(
      [&] { train_checkpointed(1, 1, a, b, 14, straight, "tp 2 -> the one-process model"); },
      with_ranks(1, {{"HASTEN_COMM", "shm"}, {"HASTEN_STRATEGY", "ddp"}}, 300));
  // That checkpoint on dp 2 x tp 2 (the loader resharded over 2 dp ranks).
  hasten::launch(
      [&] { train_checkpointed(2, 2, b, "", -1, straight, "tp 1 -> dp 2 x tp 2"); },
      with_ranks(4, {{"HASTEN_COMM", "shm"}, {"HASTEN_STRATEGY", "ddp"}}, 300));
}

// A checkpoint saved in the middle of an accumulation window holds each rank's partial
// gradients of its parts: it loads on the same mesh, and elsewhere is one line.
TEST(TensorParallel, MidWindowCheckpointLoadsOnlyOnTheSameMesh) {
  hasten::test::TempDir dir;
  const std::string ckpt = (dir.path() / "mid").string();
  auto run = [ckpt](int tp, bool save) {
    hasten::Options o = mesh_options(1, 1, tp);
    o.gradient_accumulation_steps = 2;
    Accelerator acc(o);
    torch::manual_seed(0);
    hasten::tp::ColumnParallelLinear layer(torch::nn::Linear(4, 4), acc.device_mesh().group("tp"));
    torch::optim::SGD sgd(layer->parameters(), 0.1);
    auto [model, opt] = acc.prepare(layer, sgd);
    if (save) {
      auto scope = acc.accumulate(model);
      acc.backward(model(torch::ones({2, 4})).sum());
      acc.save_state(ckpt);
      return;
    }
    try {
      acc.load_state(ckpt);
      require(tp == 2, "a mid-window tp 2 checkpoint loaded on tp " + std::to_string(tp));
    } catch (const hasten::Error& e) {
      require(tp == 1 && std::string(e.what()).find("load only on the same mesh") != std::string::npos, e.what());
    }
  };
  hasten::launch([&] { run(2, true); }, with_ranks(2, {{"HASTEN_COMM", "shm"}, {"HASTEN_STRATEGY", "ddp"}}));
  hasten::launch([&] { run(2, false); }, with_ranks(2, {{"HASTEN_COMM", "shm"}, {"HASTEN_STRATEGY", "ddp"}}));
  hasten::launch([&] { run(1, false); }, with_ranks(1, {{"HASTEN_COMM", "shm"}, {"HASTEN_STRATEGY", "ddp"}}));
}

// A column-parallel layer of 3 packed matrices (q, k, v in one), each cut by rows: its whole
// state is the whole layer, [q; k; v], not the ranks' parts side by side.
TEST(TensorParallel, PackedColumnParallelGathersWhole) {
  hasten::launch(
      [] {
        Accelerator acc(mesh_options(1, 1, 2));
        const auto tp = acc.device_mesh().group("tp");
        torch::manual_seed(0);
        torch::nn::Linear whole(4, 12);  // 3 packed matrices of 4 rows
        std::vector<torch::Tensor> w, b;
        for (int64_t m = 0; m < 3; ++m) {
          w.push_back(whole->weight.detach().narrow(0, m * 4 + tp.rank() * 2, 2));
          b.push_back(whole->bias.detach().narrow(0, m * 4 + tp.rank() * 2, 2));
        }
        hasten::tp::ColumnParallelLinear part(torch::cat(w), torch::cat(b), tp, 3);
        auto model = acc.prepare(part);
        const auto state = acc.get_state_dict(model);  // every rank takes part in the gather
        if (!acc.is_main_process()) return;
        require(state.size() == 2 && state[0].first == "weight" && torch::equal(state[0].second, whole->weight) &&
                    torch::equal(state[1].second, whole->bias),
                "the packed layer's whole state is not the whole layer");
      },
      with_ranks(2, {{"HASTEN_COMM", "shm"}, {"HASTEN_STRATEGY", "ddp"}}));
}

// vocab_parallel_cross_entropy's Sum and None reductions (the char LM's evaluation uses None) are
// cross_entropy's of the whole logits, and clip_grad_norm_'s infinity norm under tp is the
// largest gradient entry of the one-process model (each part's maximum, maxed over the group).
TEST(TensorParallel, LossReductionsAndInfinityNormEqualOneProcess) {
  hasten::launch(
      [] {
        namespace F = torch::nn::functional;
        Accelerator acc(mesh_options(1, 1, 2));
        const auto tp = acc.device_mesh().group("tp");
        auto whole = build();
        TpGpt split(*whole, tp);
        auto model = acc.prepare(split.ptr());
        const auto t = tokens(0, kBatch);
        const auto input = t.narrow(1, 0, kSeq).t(), target = t.narrow(1, 1, kSeq).t().reshape(-1);
        const auto whole_logits = whole->forward(input).reshape({-1, kVocab});
        const auto part_logits = model(input).reshape({-1, kVocab / 2});
        const auto sum = hasten::tp::vocab_parallel_cross_entropy(part_logits, target, tp, at::Reduction::Sum);
        const auto none = hasten::tp::vocab_parallel_cross_entropy(part_logits, target, tp, at::Reduction::None);
        const auto want_sum = F::cross_entropy(whole_logits, target, F::CrossEntropyFuncOptions().reduction(torch::kSum));
        const auto want_none = F::cross_entropy(whole_logits, target, F::CrossEntropyFuncOptions().reduction(torch::kNone));
        require(sum.dim() == 0 && torch::allclose(sum, want_sum, 1e-5, 0),
                "Sum: " + std::to_string(sum.item<double>()) + ", one process " + std::to_string(want_sum.item<double>()));
        require(none.sizes() == want_none.sizes() && torch::allclose(none, want_none, 1e-5, 1e-6),
                "None: the per-token losses differ from one process's (largest difference " +
                    std::to_string((none - want_none).abs().max().item<double>()) + ")");

        const double inf = std::numeric_limits<double>::infinity(), max_norm = 1e-3;
        want_sum.backward();
        const double want_norm = torch::nn::utils::clip_grad_norm_(whole->parameters(), max_norm, inf);
        acc.backward(sum);
        std::vector<torch::Tensor> before;
        for (const auto& p : split->parameters()) before.push_back(p.grad().clone());
        const double norm = acc.clip_grad_norm_(model, max_norm, inf);
        require(std::abs(norm - want_norm) <= 1e-5 * want_norm,
                "infinity norm " + std::to_string(norm) + ", one process " + std::to_string(want_norm));
        // Every gradient, split or replicated, scaled by LibTorch's coefficient for the norm it
        // returned (a parameter the clip skipped would keep its gradient).
        const double coef = max_norm / (norm + 1e-6);
        require(coef < 0.5, "the clip would barely bite (coefficient " + std::to_string(coef) + ")");
        size_t k = 0;
        for (const auto& item : split->named_parameters()) {
          const auto& b = before.at(k++);
          require(torch::allclose(item.value().grad(), b * coef, 1e-5, 1e-12),
                  item.key() + ": its gradient is not scaled by " + std::to_string(coef));
        }
      },
      with_ranks(2, {{"HASTEN_COMM", "shm"}, {"HASTEN_STRATEGY", "ddp"}}));
}

TEST(TensorParallel, TwoRanksEqualOneProcess) {
  hasten::launch([] { train_split(1, 2); }, with_ranks(2, {{"HASTEN_COMM", "shm"}, {"HASTEN_STRATEGY", "ddp"}}, 300));
}

TEST(TensorParallel, DataParallelTimesTensorParallelWithClippingEqualOneProcess) {
  hasten::launch([] { train_split(2, 2, 0.5); }, with_ranks(4, {{"HASTEN_COMM", "gloo"}, {"HASTEN_STRATEGY", "ddp"}}, 300));
}

TEST(TensorParallel, LoaderShardsOverDataParallelRanks) {
  hasten::launch(
      [] {
        Accelerator acc(mesh_options(2, 1, 2));
        hasten::DataLoader data(hasten::TensorDataset(torch::arange(16).reshape({16, 1}), torch::arange(16)),
                                {.batch_size = 2});
        auto loader = acc.prepare(data);
        std::vector<int64_t> mine;
        std::vector<torch::Tensor> metrics;
        for (auto& b : loader) {
          for (int64_t i = 0; i < b.target.size(0); ++i) mine.push_back(b.target[i].item<int64_t>());
          metrics.push_back(acc.gather_for_metrics(b.target));  // over dp: each sample once
        }
        const auto every = torch::cat(metrics);
        require(every.numel() == 16 && std::get<0>(every.sort()).equal(torch::arange(16)),
                "gather_for_metrics under tp does not give each sample once");
        auto t = torch::tensor(mine);
        auto mesh = acc.device_mesh();
        auto partner = t.clone();
        mesh.group("tp").broadcast_(partner, 0);
        require(torch::equal(t, partner), "the two ranks of a tp group read different samples");
        auto all = mesh.group("dp").all_gather(t);
        require(all.numel() == 16 && std::get<0>(all.sort()).equal(torch::arange(16)),
                "the dp ranks together do not read each sample once");
      },
      with_ranks(4, {{"HASTEN_COMM", "shm"}}));
}

TEST(TensorParallel, RefusalsAreOneLine) {
  hasten::launch(
      [] {
        try {
          hasten::Options o = mesh_options(1, 1, 2);
          o.strategy = "zero3";
          Accelerator acc(o);
          require(false, "zero3 accepted a tensor-parallel mesh");
        } catch (const hasten::Error& e) {
          require(std::string(e.what()).find("sharding a tensor-parallel mesh (tp 2) is not supported yet") !=
                      std::string::npos,
                  e.what());
        }
        hasten::Options o = mesh_options(1, 1, 2);
        o.strategy = "ddp";
        Accelerator acc(o);
        auto net = torch::nn::Linear(2, 2);
        torch::optim::SGD sgd(net->parameters(), 0.1);
        auto [model, opt] = acc.prepare(net, sgd);
        acc.backward(model(torch::ones({1, 2})).sum());
        try {
          auto scope = acc.join_uneven_inputs({model});
          require(false, "join_uneven_inputs under tp was accepted");
        } catch (const hasten::UsageError& e) {
          require(std::string(e.what()).find("joining uneven inputs under tensor parallelism") != std::string::npos,
                  e.what());
        }
        try {
          hasten::DataLoader data(hasten::TensorDataset(torch::zeros({8, 1}), torch::zeros({8})),
                                  {.batch_size = 2, .dispatch_batches = true});
          auto loader = acc.prepare(data);
          require(false, "dispatch_batches under tp was accepted");
        } catch (const hasten::UsageError& e) {
          require(std::string(e.what()).find("dispatch_batches under tensor parallelism") != std::string::npos, e.what());
        }
        HalfRows half(acc.device_mesh().group("tp"));
        auto split_model = acc.prepare(half);
        try {
          auto copy = acc.full_model(split_model);
          require(false, "full_model under tp was accepted");
        } catch (const hasten::UsageError& e) {
          require(std::string(e.what()).find("its clone would be too") != std::string::npos, e.what());
        }
      },
      with_ranks(2, {{"HASTEN_COMM", "shm"}}));
}

// A strategy built before process groups (ABI 1.10) cannot keep tensor-parallel shards apart
// from replicas: prepare refuses it under tp, and accepts it without.
TEST(TensorParallel, PreGroupsStrategyIsRefusedUnderTp) {
  const std::string plugin = hasten::test::test_plugin("pre_groups", "libhasten-strategy-pre_groups.so");
  hasten::launch(
      [plugin] {
        for (int tp : {2, 1}) {
          hasten::Options o = mesh_options(1, 1, tp);
          if (tp == 1) o.parallelism_config.reset();
          o.strategy = plugin;
          Accelerator acc(o);
          auto net = torch::nn::Linear(2, 2);
          try {
            auto model = acc.prepare(net);
            require(tp == 1, "a 1.10 strategy was accepted under tp 2");
          } catch (const hasten::UsageError& e) {
            require(tp == 2 && std::string(e.what()).find("built against plugin ABI 1.10, before process groups") !=
                                   std::string::npos,
                    e.what());
          }
        }
      },
      with_ranks(2, {{"HASTEN_COMM", "shm"}}));
}
