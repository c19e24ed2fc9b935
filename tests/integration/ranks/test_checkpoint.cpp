// Checkpoints through the public API: a run stopped after 20 micro-batches, saved, and
// resumed in new processes ends bitwise equal (parameters and Adam state) to the same run
// uninterrupted, for single, ddp, zero3 and fsdp, with a shuffled loader stopped mid-epoch,
// accumulation of 2, dropout (RNG) and a scheduler; damaged checkpoints are refused and
// load_state() falls back to the newest complete one; total_limit keeps the newest N.
#include <hasten/hasten.hpp>
#include <hasten/plugin_torch.hpp>
#include <hasten/plugin_optimizer_state.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "test_util.hpp"

// Named, so that a unity build of this file with others has no clashing helper names.
namespace checkpoint_tests {

namespace fs = std::filesystem;
using hasten::Accelerator;
using hasten::Options;
namespace F = torch::nn::functional;

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", hasten::Unit<torch::nn::Linear>(6, 16));
    drop = register_module("drop", torch::nn::Dropout(0.25));
    fc2 = register_module("fc2", hasten::Unit<torch::nn::Linear>(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(drop(torch::relu(fc1(x)))); }
  hasten::Unit<torch::nn::Linear> fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};

// A counter registered for checkpointing (bytes).
struct Counter {
  int64_t value = 0;
  std::string state_dict() const { return std::to_string(value); }
  void load_state_dict(const std::string& bytes) { value = std::stoll(bytes); }
};

// Trains `until` micro-batches in total (loading the newest checkpoint first with resume),
// saves when asked, and writes the full parameters and this rank's Adam state to `out`.
// With a `resume_config` ("auto", a directory) the config key resumes instead of load_state.
void train(const std::string& strategy, const fs::path& project, int until, bool resume, bool save,
           const fs::path& out, const std::string& resume_config = "") {
  Options o;
  if (!resume_config.empty()) o.resume = resume_config;
  o.strategy = strategy;
  o.gradient_accumulation_steps = 2;
  o.project_dir = project.string();
  Accelerator acc(o);
  torch::manual_seed(7);
  auto net = std::make_shared<NetImpl>();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
  torch::optim::StepLR steplr(adam, 3, 0.5);
  auto x = torch::randn({50, 6});
  auto y = torch::randint(0, 3, {50});
  hasten::DataLoader data(hasten::TensorDataset(x, y), {.batch_size = 4, .shuffle = true, .seed = 3});
  auto [model, opt, loader, sched] = acc.prepare(net, adam, data, steplr);
  Counter micro;
  acc.register_for_checkpointing(micro);
  acc.set_seed(11, /*device_specific=*/true);
  if (resume) acc.load_state();
  if (!resume_config.empty()) std::ofstream(out / "resumed_from.txt") << acc.resumed_from();
  while (micro.value < until) {
    for (auto& b : loader) {
      auto scope = acc.accumulate(model);
      acc.backward(F::cross_entropy(model(b.input), b.target));
      opt.step();
      sched.step();
      opt.zero_grad();
      if (++micro.value == until) {
        if (save) acc.save_state();  // mid-epoch: the iteration is under way
        break;
      }
    }
  }
  auto full = acc.get_state_dict(model);
  if (acc.is_main_process()) hasten::save_safetensors((out / "params.safetensors").string(), full);
  hasten::NamedTensors moments;
  size_t i = 0;
  for (auto& group : adam.param_groups())
    for (auto& p : group.params()) {
      auto it = adam.state().find(hasten::compat::state_key(p));
      if (it == adam.state().end()) continue;
      auto& s = static_cast<torch::optim::AdamParamState&>(*it->second);
      moments.emplace_back("p" + std::to_string(i) + ".exp_avg", s.exp_avg());
      moments.emplace_back("p" + std::to_string(i) + ".exp_avg_sq", s.exp_avg_sq());
      moments.emplace_back("p" + std::to_string(i) + ".step", torch::tensor(s.step()));
      ++i;
    }
  hasten::save_safetensors((out / ("adam_" + std::to_string(acc.process_index()) + ".safetensors")).string(), moments);
  std::ofstream(out / "lr.txt") << adam.param_groups()[0].options().get_lr();
}

hasten::LaunchOptions ranks(int n) { return hasten::test::with_ranks(n, {}, 180); }

void expect_same_files(const fs::path& a, const fs::path& b, int world) {
  std::vector<std::string> files = {"params.safetensors"};
  for (int r = 0; r < world; ++r) files.push_back("adam_" + std::to_string(r) + ".safetensors");
  for (auto& f : files) {
    auto x = hasten::load_safetensors((a / f).string()), y = hasten::load_safetensors((b / f).string());
    ASSERT_EQ(x.size(), y.size()) << f;
    ASSERT_GT(x.size(), 0u) << f;
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].first, y[i].first) << f;
      EXPECT_TRUE(torch::equal(x[i].second, y[i].second)) << f << ": " << x[i].first << " differs after resume";
    }
  }
  std::ifstream la(a / "lr.txt"), lb(b / "lr.txt");
  std::string lra, lrb;
  la >> lra, lb >> lrb;
  EXPECT_EQ(lra, lrb) << "the scheduler's learning rate";
}

void exact_resume(const std::string& strategy, int world, int stop = 20) {
  hasten::test::TempDir dir;
  const fs::path whole = dir.path() / "whole", parts = dir.path() / "parts", a = dir.path() / "a", b = dir.path() / "b";
  for (auto& d : {a, b}) fs::create_directories(d);
  hasten::launch([&] { train(strategy, whole, 40, false, false, a); }, ranks(world));
  hasten::launch([&] { train(strategy, parts, stop, false, true, b); }, ranks(world));
  ASSERT_TRUE(fs::exists(parts / "checkpoints" / "checkpoint_0" / "manifest.json"));
  hasten::launch([&] { train(strategy, parts, 40, true, false, b); }, ranks(world));
  expect_same_files(a, b, world);
}

}  // namespace

// The config key resume: auto starts fresh when there is no checkpoint yet and continues from
// the newest one when there is, with no load_state call, exactly as load_state does.
TEST(Checkpoint, ResumeAutoStartsFreshThenContinuesExactly) {
  hasten::test::TempDir dir;
  const fs::path whole = dir.path() / "whole", parts = dir.path() / "parts", a = dir.path() / "a", b = dir.path() / "b";
  for (auto& d : {a, b}) fs::create_directories(d);
  hasten::launch([&] { train("ddp", whole, 40, false, false, a); }, ranks(2));
  hasten::launch([&] { train("ddp", parts, 19, false, true, b, "auto"); }, ranks(2));
  EXPECT_EQ(hasten::test::TempDir::read_file(b / "resumed_from.txt"), "") << "a fresh start resumed";
  hasten::launch([&] { train("ddp", parts, 40, false, false, b, "auto"); }, ranks(2));
  EXPECT_EQ(hasten::test::TempDir::read_file(b / "resumed_from.txt"), (parts / "checkpoints" / "checkpoint_0").string());
  expect_same_files(a, b, 2);
}

// resume: a directory loads that checkpoint; one that is not a checkpoint is an error, and so
// is resume: auto over only damaged checkpoints.
TEST(Checkpoint, ResumeFromADirectoryAndItsErrors) {
  hasten::test::TempDir dir;
  const fs::path parts = dir.path() / "parts", b = dir.path() / "b";
  fs::create_directories(b);
  train("single", parts, 6, false, true, b);
  const fs::path ckpt = parts / "checkpoints" / "checkpoint_0";
  train("single", dir.path() / "other", 10, false, false, b, ckpt.string());
  EXPECT_EQ(hasten::test::TempDir::read_file(b / "resumed_from.txt"), ckpt.string());
  try {
    train("single", dir.path() / "other", 10, false, false, b, (dir.path() / "nothing").string());
    FAIL() << "resume from a missing directory was accepted";
  } catch (const hasten::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing"), std::string::npos) << e.what();
  }
  fs::remove(ckpt / "manifest.json");
  try {
    train("single", parts, 10, false, false, b, "auto");
    FAIL() << "resume: auto over a damaged checkpoint only was accepted";
  } catch (const hasten::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no complete checkpoint"), std::string::npos) << e.what();
  }
}

// Pre-hooks must leave the same models on every rank (the weights are gathered collectively):
// a difference, or a hook that fails on one rank only, is an error on every rank (not a hang),
// and no checkpoint or staging directory is left.
TEST(Checkpoint, PreHooksThatDisagreeAcrossRanksAreAnErrorOnEveryRank) {
  hasten::test::TempDir dir;
  const fs::path out = dir.path();
  hasten::launch(
      [&] {
        Options o;
        o.strategy = "ddp";
        Accelerator acc(o);
        auto net = std::make_shared<torch::nn::LinearImpl>(4, 2);
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
        auto [model, opt] = acc.prepare(net, sgd);
        const int r = acc.process_index();
        auto outcome = [&](const std::string& where) -> std::string {
          try {
            acc.save_state((out / where).string());
            return "saved";
          } catch (const hasten::Error& e) {
            return e.what();
          }
        };
        auto h = acc.register_save_state_pre_hook([r](hasten::StateHookArgs& a) {
          if (r == 1) a.models.clear();
        });
        const std::string differ = outcome("a");
        h.remove();
        acc.register_save_state_pre_hook([r](hasten::StateHookArgs&) {
          if (r == 0) throw std::runtime_error("disk quota exceeded");
        });
        const std::string fails = outcome("b");
        std::ofstream(out / ("rank_" + std::to_string(r) + ".txt")) << differ << "\n" << fails << "\n";
      },
      ranks(2));
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(out / ("rank_" + std::to_string(r) + ".txt"));
    std::string differ, fails;
    std::getline(in, differ);
    std::getline(in, fails);
    EXPECT_NE(differ.find("save_state: the pre-hooks left different models on different ranks"), std::string::npos)
        << "rank " << r << ": " << differ;
    EXPECT_NE(fails.find(r == 0 ? "save_state: a pre-hook failed: disk quota exceeded" : "failed on another rank"),
              std::string::npos)
        << "rank " << r << ": " << fails;
  }
  for (const char* name : {"a", "b"}) {
    EXPECT_FALSE(fs::exists(out / name)) << name;
    for (auto& e : fs::directory_iterator(out))
      EXPECT_EQ(e.path().filename().string().find(std::string(name) + "."), std::string::npos) << e.path();
  }
}

// One rank: 13 batches an epoch, so micro-batch 20 is the 7th of epoch 2: the save falls in
// the middle of an accumulation window and the partial gradients are part of the state.
TEST(Checkpoint, ExactResumeSingleMidWindow) { exact_resume("single", 1); }
TEST(Checkpoint, ExactResumeSingle) { exact_resume("single", 1, 22); }
TEST(Checkpoint, ExactResumeDdp) { exact_resume("ddp", 2); }
// Two ranks: 7 batches an epoch; micro-batch 19 is the 5th of epoch 3 (mid-window).
TEST(Checkpoint, ExactResumeDdpMidWindow) { exact_resume("ddp", 2, 19); }
TEST(Checkpoint, ExactResumeZero3) { exact_resume("zero3", 2); }
TEST(Checkpoint, ExactResumeFsdp) { exact_resume("fsdp", 2); }
// Mid-window under the sharding strategies: each rank's local, not yet reduced gradients
// (the units' full gradient buffers) are saved and taken back by the strategy at the next
// backward. Stage 1 keeps its gradient buffers allocated, stages 2 and 3 and fsdp free them
// after each reduction, and stage 3 frees the parameters too.
TEST(Checkpoint, ExactResumeZero1MidWindow) { exact_resume("zero1", 2, 19); }
TEST(Checkpoint, ExactResumeZero2MidWindow) { exact_resume("zero2", 2, 19); }
TEST(Checkpoint, ExactResumeZero3MidWindow) { exact_resume("zero3", 2, 19); }
TEST(Checkpoint, ExactResumeFsdpMidWindow) { exact_resume("fsdp", 2, 19); }

namespace {

// One process, one step between saves: enough to make checkpoints that differ.
struct SmallRun {
  explicit SmallRun(const fs::path& project, int total_limit = 0, bool automatic = true) {
    Options o;
    o.project_dir = project.string();
    o.automatic_checkpoint_naming = automatic;
    o.total_limit = total_limit;
    acc = std::make_unique<Accelerator>(o);
    torch::manual_seed(1);
    net = torch::nn::Linear(4, 2);
    adam = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.1));
    auto prepared = acc->prepare(net, *adam);
    model = std::make_unique<hasten::PreparedModel<torch::nn::Linear>>(std::get<0>(prepared));
  }
  void step() {
    acc->backward(model->operator()(torch::ones({3, 4})).pow(2).sum());
    adam->step();
    adam->zero_grad();
  }
  std::unique_ptr<Accelerator> acc;
  torch::nn::Linear net{nullptr};
  std::unique_ptr<torch::optim::Adam> adam;
  std::unique_ptr<hasten::PreparedModel<torch::nn::Linear>> model;
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const hasten::Error& e) {
    return e.what();
  }
  return "(no error)";
}

void flip_a_byte(const fs::path& file, size_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

}  // namespace

TEST(Checkpoint, TotalLimitKeepsTheNewestAndNumberingContinuesAfterLoad) {
  hasten::test::TempDir dir;
  {
    SmallRun run(dir.path(), 2);
    for (int i = 0; i < 4; ++i) {
      run.step();
      EXPECT_EQ(run.acc->save_state(), (dir.path() / "checkpoints" / ("checkpoint_" + std::to_string(i))).string());
    }
  }
  std::vector<std::string> left;
  for (auto& e : fs::directory_iterator(dir.path() / "checkpoints")) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"checkpoint_2", "checkpoint_3"}));
  SmallRun again(dir.path(), 2);
  EXPECT_EQ(again.acc->load_state(), (dir.path() / "checkpoints" / "checkpoint_3").string());
  EXPECT_EQ(again.acc->save_iteration(), 4);
  // Saving again without loading first would overwrite history: refused, loudly.
  SmallRun fresh(dir.path(), 2);
  const std::string e = error_of([&] { fresh.acc->save_state(); });
  EXPECT_EQ(e, "(no error)");  // checkpoint_0 was pruned, so the name is free
}

TEST(Checkpoint, DamagedCheckpointsAreRefusedAndTheNewestCompleteOneIsLoaded) {
  hasten::test::TempDir dir;
  const fs::path ckpts = dir.path() / "checkpoints";
  torch::Tensor weight_at_1;
  {
    SmallRun run(dir.path());
    for (int i = 0; i < 3; ++i) {
      run.step();
      run.acc->save_state();
      if (i == 1) weight_at_1 = run.net->weight.detach().clone();
    }
  }
  // A bit flipped in the newest: refused by name, and load_state() falls back to checkpoint_1.
  flip_a_byte(ckpts / "checkpoint_2" / "model.safetensors", 100);
  SmallRun run(dir.path());
  std::string e = error_of([&] { run.acc->load_state((ckpts / "checkpoint_2").string()); });
  EXPECT_NE(e.find("model.safetensors' does not match its checksum (corrupt)"), std::string::npos) << e;
  EXPECT_EQ(run.acc->load_state(), (ckpts / "checkpoint_1").string());
  EXPECT_TRUE(torch::equal(run.net->weight, weight_at_1));
  EXPECT_EQ(run.acc->save_iteration(), 3) << "after the newest numbered directory: the damaged one is left alone";
  // Truncated, missing manifest, a save that died (temporary directory), nothing left.
  fs::resize_file(ckpts / "checkpoint_1" / "optimizer.rank0.safetensors", 10);
  e = error_of([&] { run.acc->load_state((ckpts / "checkpoint_1").string()); });
  EXPECT_NE(e.find("optimizer.rank0.safetensors' has 10 bytes, the manifest says"), std::string::npos) << e;
  fs::remove(ckpts / "checkpoint_0" / "manifest.json");
  e = error_of([&] { run.acc->load_state((ckpts / "checkpoint_0").string()); });
  EXPECT_NE(e.find("has no manifest.json (it is incomplete"), std::string::npos) << e;
  fs::create_directories(ckpts / ".checkpoint_3.saving");
  e = error_of([&] { run.acc->load_state(); });
  EXPECT_NE(e.find("no complete checkpoint under '" + ckpts.string() + "' (3 damaged or incomplete"), std::string::npos) << e;
  e = error_of([&] { run.acc->load_state((dir.path() / "nowhere").string()); });
  EXPECT_NE(e.find("nowhere' does not exist"), std::string::npos) << e;
}

TEST(Checkpoint, AnExplicitDirectoryIsReplacedAtomicallyAndMismatchesAreNamed) {
  hasten::test::TempDir dir;
  const fs::path target = dir.path() / "mine";
  Options o;
  o.project_dir = dir.path().string();
  SmallRun run(dir.path(), 0, /*automatic=*/false);
  run.step();
  EXPECT_EQ(run.acc->save_state(target.string()), target.string());
  run.step();
  run.acc->save_state(target.string());  // again: the new one replaces the old
  EXPECT_TRUE(fs::exists(target / "manifest.json"));
  EXPECT_FALSE(fs::exists(dir.path() / ".mine.replaced"));
  EXPECT_FALSE(fs::exists(dir.path() / ".mine.saving"));
  // Anything at the target that is not a checkpoint is left alone.
  fs::create_directories(dir.path() / "notes");
  std::ofstream(dir.path() / "notes" / "todo.txt") << "mine\n";
  std::string refused = error_of([&] { run.acc->save_state((dir.path() / "notes").string()); });
  EXPECT_NE(refused.find("exists and is not a hasten checkpoint (no manifest.json of hasten's checkpoint format); it "
                         "is left alone"),
            std::string::npos)
      << refused;
  EXPECT_TRUE(fs::exists(dir.path() / "notes" / "todo.txt"));
  // A file, or a link to a checkpoint, at the target is refused and left as it is.
  std::ofstream(dir.path() / "afile") << "data\n";
  refused = error_of([&] { run.acc->save_state((dir.path() / "afile").string()); });
  EXPECT_NE(refused.find("afile' exists and is not a hasten checkpoint (not a directory)"), std::string::npos) << refused;
  fs::create_directory_symlink(target, dir.path() / "alink");
  refused = error_of([&] { run.acc->save_state((dir.path() / "alink").string()); });
  EXPECT_NE(refused.find("alink' exists and is not a hasten checkpoint (a symbolic link)"), std::string::npos) << refused;
  EXPECT_TRUE(fs::is_symlink(dir.path() / "alink"));
  EXPECT_TRUE(fs::exists(target / "manifest.json"));
  // A web project's manifest.json does not make a directory a checkpoint.
  fs::create_directories(dir.path() / "site");
  std::ofstream(dir.path() / "site" / "manifest.json") << R"({"name": "my app", "files": {}})";
  refused = error_of([&] { run.acc->save_state((dir.path() / "site").string()); });
  EXPECT_NE(refused.find("site' exists and is not a hasten checkpoint"), std::string::npos) << refused;
  {
    std::ifstream in(dir.path() / "site" / "manifest.json");
    const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(kept, R"({"name": "my app", "files": {}})");
  }
  // Neither a leftover temporary directory nor a set-aside one that hasten did not make is removed.
  fs::create_directories(dir.path() / ".other.saving");
  std::ofstream(dir.path() / ".other.saving" / "keep.txt") << "x";
  refused = error_of([&] { run.acc->save_state((dir.path() / "other").string()); });
  EXPECT_NE(refused.find(".other.saving' exists and was not made by hasten's save_state"), std::string::npos) << refused;
  EXPECT_TRUE(fs::exists(dir.path() / ".other.saving" / "keep.txt"));
  fs::create_directories(dir.path() / ".third.replaced");
  std::ofstream(dir.path() / ".third.replaced" / "keep.txt") << "x";
  refused = error_of([&] { run.acc->save_state((dir.path() / "third").string()); });
  EXPECT_NE(refused.find(".third.replaced' exists and is not a hasten checkpoint"), std::string::npos) << refused;
  EXPECT_TRUE(fs::exists(dir.path() / ".third.replaced" / "keep.txt"));
  EXPECT_FALSE(fs::exists(dir.path() / "third"));
  refused = error_of([&] { run.acc->save_state(dir.path().string()); });
  EXPECT_NE(refused.find("is not a hasten checkpoint"), std::string::npos) << refused;
  // A relative name of one component (save_state("ckpt")) is a directory in the working one.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  EXPECT_EQ(error_of([&] { run.acc->save_state("ckpt"); }), "(no error)");
  fs::current_path(cwd);
  EXPECT_TRUE(fs::exists(dir.path() / "ckpt" / "manifest.json"));
  // Another optimizer type is refused before anything is loaded into it.
  {
    Accelerator sgd_run(o);
    torch::nn::Linear lin(4, 2);
    torch::optim::SGD sgd(lin->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto prepared_sgd = sgd_run.prepare(lin, sgd);
    (void)prepared_sgd;
    const std::string mismatch = error_of([&] { sgd_run.load_state(target.string()); });
    EXPECT_NE(mismatch.find("optimizer 0 was Adam when saved, this program prepared SGD"), std::string::npos)
        << mismatch;
  }
  // A program that prepared something else is told what differs.
  Accelerator other(o);
  torch::nn::Linear small(4, 2), extra(2, 2);
  auto prepared = other.prepare(small, extra);
  (void)prepared;
  const std::string e = error_of([&] { other.load_state(target.string()); });
  EXPECT_NE(e.find("the checkpoint holds 1 models, this program prepared 2"), std::string::npos) << e;
}

namespace {

// Prepares what train() prepares and loads `ckpt`; writes what load_state said (or "(no
// error)") to <out>/error_<rank>.txt.
void load_error(const std::string& strategy, const fs::path& ckpt, const fs::path& out) {
  Options o;
  o.strategy = strategy;
  o.project_dir = (out / "unused").string();
  Accelerator acc(o);
  auto net = std::make_shared<NetImpl>();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
  torch::optim::StepLR steplr(adam, 3, 0.5);
  hasten::DataLoader data(hasten::TensorDataset(torch::randn({50, 6}), torch::randint(0, 3, {50})), {.batch_size = 4});
  auto prepared = acc.prepare(net, adam, data, steplr);
  (void)prepared;
  Counter micro;
  acc.register_for_checkpointing(micro);
  std::ofstream(out / ("error_" + std::to_string(acc.process_index()) + ".txt"))
      << error_of([&] { acc.load_state(ckpt.string()); });
}

}  // namespace

// Each rank reads only its own optimizer pieces and verifies them as it reads: a bit flipped
// in rank 1's file is found by rank 1, and every rank refuses the checkpoint naming the file.
// A file no rank of the loading run reads (rank 1's random state, loaded on one rank) is
// verified by rank 0.
TEST(Checkpoint, ADamagedFileOnlyOneRankReadsIsRefusedOnEveryRank) {
  hasten::test::TempDir dir;
  const fs::path project = dir.path() / "p", ckpt = project / "checkpoints" / "checkpoint_0";
  hasten::launch([&] { train("zero3", project, 20, false, true, dir.path()); }, ranks(2));
  const fs::path pieces = ckpt / "optimizer.rank1.safetensors";
  flip_a_byte(pieces, static_cast<size_t>(fs::file_size(pieces)) - 5);
  hasten::launch([&] { load_error("zero3", ckpt, dir.path()); }, ranks(2));
  for (int r = 0; r < 2; ++r) {
    const std::string e = hasten::test::TempDir::read_file(dir.path() / ("error_" + std::to_string(r) + ".txt"));
    EXPECT_NE(e.find("optimizer.rank1.safetensors' does not match its checksum (corrupt)"), std::string::npos)
        << "rank " << r << ": " << e;
  }
  flip_a_byte(pieces, static_cast<size_t>(fs::file_size(pieces)) - 5);  // repaired
  hasten::launch([&] { load_error("zero3", ckpt, dir.path()); }, ranks(2));
  EXPECT_EQ(hasten::test::TempDir::read_file(dir.path() / "error_1.txt"), "(no error)");
  flip_a_byte(ckpt / "random_states_1.safetensors", 60);
  load_error("single", ckpt, dir.path());
  const std::string e = hasten::test::TempDir::read_file(dir.path() / "error_0.txt");
  EXPECT_NE(e.find("random_states_1.safetensors' does not match its checksum (corrupt)"), std::string::npos) << e;
}

namespace {

// Loads the newest checkpoint under `project` (saved by any number of ranks under any
// strategy) on this launch's ranks; then writes the full parameters and, with one rank, the
// Adam state of every parameter by name to `out`, or saves a new checkpoint under `resave`.
void load_and_dump(const std::string& strategy, const fs::path& project, const fs::path& out, const fs::path& resave) {
  Options o;
  o.strategy = strategy;
  o.project_dir = project.string();
  Accelerator acc(o);
  torch::manual_seed(99);  // other initial values: everything must come from the checkpoint
  auto net = std::make_shared<NetImpl>();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
  torch::optim::StepLR steplr(adam, 3, 0.5);
  hasten::DataLoader data(hasten::TensorDataset(torch::randn({50, 6}), torch::randint(0, 3, {50})), {.batch_size = 4});
  auto [model, opt, loader, sched] = acc.prepare(net, adam, data, steplr);
  Counter micro;
  acc.register_for_checkpointing(micro);
  acc.load_state();
  if (!resave.empty()) {
    acc.save_state((resave / "checkpoint").string());
    return;
  }
  auto full = acc.get_state_dict(model);
  if (!acc.is_main_process()) return;
  hasten::NamedTensors dump = full;
  for (auto& named : net->named_parameters())
    for (auto& [key, value] : hasten::sdk::param_state(adam, named.value()))
      dump.emplace_back(named.key() + "/" + key, value);
  hasten::save_safetensors((out / "state.safetensors").string(), dump);
}

}  // namespace

TEST(Checkpoint, ReshardingZero3From2To3And1RanksKeepsEveryTensor) {
  hasten::test::TempDir dir;
  const fs::path p2 = dir.path() / "two", p3 = dir.path() / "three", x = dir.path() / "x", y = dir.path() / "y";
  for (auto& d : {x, y}) fs::create_directories(d);
  hasten::launch([&] { train("zero3", p2, 20, false, true, dir.path()); }, ranks(2));
  // 2 zero3 ranks -> 1 rank (single): the full state.
  hasten::launch([&] { load_and_dump("single", p2, x, {}); }, ranks(1));
  // 2 -> 3 zero3 ranks, saved again there, then -> 1 rank: the same state, bit for bit.
  hasten::launch([&] { load_and_dump("zero3", p2, {}, p3); }, ranks(3));
  fs::create_directories(p3 / "checkpoints");
  fs::rename(p3 / "checkpoint", p3 / "checkpoints" / "checkpoint_0");
  hasten::launch([&] { load_and_dump("single", p3, y, {}); }, ranks(1));
  auto a = hasten::load_safetensors((x / "state.safetensors").string());
  auto b = hasten::load_safetensors((y / "state.safetensors").string());
  auto saved = hasten::load_safetensors((p2 / "checkpoints" / "checkpoint_0" / "model.safetensors").string());
  ASSERT_EQ(a.size(), b.size());
  size_t moments = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first << " changed going through 3 ranks";
    moments += a[i].first.find("/exp_avg") != std::string::npos;
  }
  EXPECT_EQ(moments, 8u) << "exp_avg and exp_avg_sq of the 4 parameters";
  for (auto& [name, t] : saved) {
    auto it = std::find_if(a.begin(), a.end(), [&](auto& e) { return e.first == name; });
    ASSERT_NE(it, a.end()) << name;
    EXPECT_TRUE(torch::equal(it->second, t)) << name << " differs from the zero3 checkpoint's";
  }
  // The Adam moments on 1 rank are the 2 zero3 ranks' shards put together: check one against
  // the pieces the checkpoint holds.
  auto piece = hasten::load_safetensors((p2 / "checkpoints" / "checkpoint_0" / "optimizer.rank1.safetensors").string());
  ASSERT_FALSE(piece.empty());
  for (auto& [name, t] : piece) {
    const auto colon = name.find(':'), at = name.rfind('@');
    if (at == std::string::npos) continue;
    const std::string key = name.substr(colon + 1, at - colon - 1);
    const int64_t offset = std::stoll(name.substr(at + 1));
    auto it = std::find_if(a.begin(), a.end(), [&](auto& e) { return e.first == key; });
    ASSERT_NE(it, a.end()) << key;
    EXPECT_TRUE(torch::equal(it->second.reshape(-1).narrow(0, offset, t.numel()), t)) << name;
  }
}

// Under a sharding strategy each rank reads only its slices of model.safetensors (ABI 1.5
// load_state_dict_ranges), verifying the 1 MiB chunks it touches; a checkpoint whose manifest
// lists no chunk checksums (written before they existed) is read whole (ABI 1.3
// load_state_dict) to the same state; a flipped bit in the model file is refused on every rank.
TEST(Checkpoint, SlicedAndWholeModelReadsLoadTheSameStateAndDamageIsRefused) {
  hasten::test::TempDir dir;
  const fs::path p2 = dir.path() / "two", old = dir.path() / "old", bad = dir.path() / "bad";
  const fs::path r1 = dir.path() / "r1", r2 = dir.path() / "r2", x = dir.path() / "x", y = dir.path() / "y";
  for (auto& d : {x, y}) fs::create_directories(d);
  hasten::launch([&] { train("zero3", p2, 20, false, true, dir.path()); }, ranks(2));
  const fs::path ckpt = p2 / "checkpoints" / "checkpoint_0";
  const auto manifest = nlohmann::json::parse(hasten::test::TempDir::read_file(ckpt / "manifest.json"));
  ASSERT_TRUE(manifest["files"]["model.safetensors"].contains("chunks"));
  EXPECT_EQ(manifest["files"]["model.safetensors"]["chunk_size"].get<uint64_t>(), uint64_t{1} << 20);
  for (auto& d : {old, bad}) fs::copy(p2, d, fs::copy_options::recursive);
  {  // the manifest of a checkpoint written before chunk checksums existed
    auto m = manifest;
    for (auto& [name, f] : m["files"].items()) f.erase("chunks"), f.erase("chunk_size");
    std::ofstream(old / "checkpoints" / "checkpoint_0" / "manifest.json") << m.dump(1);
  }
  // 2 zero3 ranks -> 3 zero3 ranks, sliced and whole, each saved again and read on 1 rank.
  for (auto& [from, to] : {std::pair{p2, r1}, std::pair{old, r2}}) {
    hasten::launch([&] { load_and_dump("zero3", from, {}, to); }, ranks(3));
    fs::create_directories(to / "checkpoints");
    fs::rename(to / "checkpoint", to / "checkpoints" / "checkpoint_0");
  }
  hasten::launch([&] { load_and_dump("single", r1, x, {}); }, ranks(1));
  hasten::launch([&] { load_and_dump("single", r2, y, {}); }, ranks(1));
  auto a = hasten::load_safetensors((x / "state.safetensors").string());
  auto b = hasten::load_safetensors((y / "state.safetensors").string());
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first << ": sliced and whole reads differ";
  }
  const fs::path model = bad / "checkpoints" / "checkpoint_0" / "model.safetensors";
  flip_a_byte(model, static_cast<size_t>(fs::file_size(model)) - 3);  // the last tensor's data
  hasten::launch([&] { load_error("zero3", bad / "checkpoints" / "checkpoint_0", dir.path()); }, ranks(2));
  for (int r = 0; r < 2; ++r) {
    const std::string e = hasten::test::TempDir::read_file(dir.path() / ("error_" + std::to_string(r) + ".txt"));
    EXPECT_NE(e.find("model.safetensors' does not match its checksum (corrupt"), std::string::npos) << "rank " << r << ": " << e;
  }
}

namespace {

struct PlainNetImpl : torch::nn::Module {
  PlainNetImpl() {
    fc1 = register_module("fc1", hasten::Unit<torch::nn::Linear>(6, 16));
    fc2 = register_module("fc2", hasten::Unit<torch::nn::Linear>(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  hasten::Unit<torch::nn::Linear> fc1{nullptr}, fc2{nullptr};
};

// A run whose global batch is 12 samples whatever its number of ranks (12 / world each), so
// that runs on 1, 2 and 3 ranks see the same samples per optimizer step: no dropout, SGD with
// momentum (linear in the gradients), accumulation of 2. Trains `until` micro-batches,
// saving at the end when asked; writes the full parameters to `out`.
void train_global_batch(const std::string& strategy, int world, const fs::path& project, int until, bool resume, bool save,
                        const fs::path& out) {
  Options o;
  o.strategy = strategy;
  o.gradient_accumulation_steps = 2;
  o.project_dir = project.string();
  Accelerator acc(o);
  torch::manual_seed(7);
  auto net = std::make_shared<PlainNetImpl>();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto x = torch::randn({48, 6});
  auto y = torch::randint(0, 3, {48});
  hasten::DataLoader data(hasten::TensorDataset(x, y), {.batch_size = 12 / world, .shuffle = true, .seed = 3});
  auto [model, opt, loader] = acc.prepare(net, sgd, data);
  Counter micro;
  acc.register_for_checkpointing(micro);
  if (resume) acc.load_state();
  while (micro.value < until) {
    for (auto& b : loader) {
      auto scope = acc.accumulate(model);
      acc.backward(F::cross_entropy(model(b.input), b.target));
      opt.step();
      opt.zero_grad();
      if (++micro.value == until) {
        if (save) acc.save_state();
        break;
      }
    }
  }
  auto full = acc.get_state_dict(model);
  if (acc.is_main_process()) hasten::save_safetensors((out / "params.safetensors").string(), full);
}

}  // namespace

// A zero3 checkpoint of 2 ranks saved after micro-batch 5 (the middle of a window of 2) holds
// each rank's partial gradients; on 3 zero3 ranks and on 1 rank (single) every rank takes
// their mean, so the window's average comes out as on 2 ranks, and training continues to
// the parameters of the uninterrupted 2-rank run. Not bitwise: the same sums are added in
// another order (3 or 1 ranks' partial sums, and the mean of the saved ones), so the
// parameters agree to float32 rounding, far below what one lost micro-batch would change.
TEST(Checkpoint, MidWindowGradientsReshardFrom2To3And1Ranks) {
  hasten::test::TempDir dir;
  const fs::path whole = dir.path() / "whole", parts = dir.path() / "parts";
  const fs::path a = dir.path() / "a", b = dir.path() / "b", c = dir.path() / "c";
  for (auto& d : {a, b, c}) fs::create_directories(d);
  hasten::launch([&] { train_global_batch("zero3", 2, whole, 10, false, false, a); }, ranks(2));
  hasten::launch([&] { train_global_batch("zero3", 2, parts, 5, false, true, dir.path()); }, ranks(2));
  const fs::path ckpt = parts / "checkpoints" / "checkpoint_0";
  ASSERT_TRUE(fs::exists(ckpt / "gradients.rank1.safetensors")) << "the save was meant to be mid-window";
  hasten::launch([&] { train_global_batch("zero3", 3, parts, 10, true, false, b); }, ranks(3));
  hasten::launch([&] { train_global_batch("single", 1, parts, 10, true, false, c); }, ranks(1));
  auto expected = hasten::load_safetensors((a / "params.safetensors").string());
  ASSERT_EQ(expected.size(), 4u);
  for (auto& out : {b, c}) {
    auto got = hasten::load_safetensors((out / "params.safetensors").string());
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, expected[i].first);
      EXPECT_TRUE(torch::allclose(got[i].second, expected[i].second, 1e-5, 1e-6))
          << out.filename() << ": " << got[i].first << " differs by "
          << (got[i].second - expected[i].second).abs().max().item<double>();
    }
  }
}

// The shard is written under a temporary name and cannot take its final one (a non-empty
// directory has it): save_model fails and leaves no temporary file behind.
TEST(Weights, AFailedSaveModelLeavesNoTemporaryShard) {
  hasten::test::TempDir dir;
  const fs::path out = dir.path() / "out";
  fs::create_directories(out / "model.safetensors" / "inside");
  Options o;
  Accelerator acc(o);
  auto net = std::make_shared<NetImpl>();
  auto model = acc.prepare(net);
  try {
    acc.save_model(model, out.string());
    ADD_FAILURE() << "save_model wrote over a non-empty directory";
  } catch (const hasten::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("save_model: ", 0), 0u) << e.what();
  }
  for (auto& entry : fs::directory_iterator(out))
    EXPECT_EQ(entry.path().extension(), ".safetensors") << "left behind: " << entry.path();
}

TEST(Weights, SaveModelShardsByteSizeAndLoadWeightsReproducesTheModel) {
  hasten::test::TempDir dir;
  const fs::path sharded = dir.path() / "sharded", whole = dir.path() / "whole";
  hasten::launch(
      [&] {
        Options o;
        o.strategy = "zero3";
        Accelerator acc(o);
        torch::manual_seed(5);
        auto net = std::make_shared<NetImpl>();
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
        auto [model, opt] = acc.prepare(net, sgd);
        for (int i = 0; i < 3; ++i) {
          acc.backward(model(torch::randn({4, 6})).pow(2).mean());
          opt.step();
          opt.zero_grad();
        }
        acc.save_model(model, sharded.string(), "300B");  // fc1.weight alone is 384 bytes
        acc.save_model(model, whole.string());
        auto full = acc.get_state_dict(model);
        if (acc.is_main_process()) hasten::save_safetensors((dir.path() / "params.safetensors").string(), full);
      },
      ranks(2));
  EXPECT_TRUE(fs::exists(whole / "model.safetensors"));
  EXPECT_FALSE(fs::exists(whole / "model.safetensors.index.json"));
  ASSERT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));
  // fc1.weight (384 bytes) alone, then fc1.bias, fc2.weight and fc2.bias (268 bytes).
  EXPECT_TRUE(fs::exists(sharded / "model-00001-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(sharded / "model-00002-of-00002.safetensors"));
  const auto want = hasten::load_safetensors((dir.path() / "params.safetensors").string());
  for (const fs::path& from : {sharded, whole / "model.safetensors"}) {
    torch::manual_seed(123);
    NetImpl fresh;
    hasten::load_weights(fresh, from.string());
    for (auto& [name, t] : want) EXPECT_TRUE(torch::equal(fresh.named_parameters()[name], t)) << name << " from " << from;
  }
  // Merging the shards gives the single file's tensors.
  hasten::merge_weights(sharded.string(), (dir.path() / "merged.safetensors").string());
  auto merged = hasten::load_safetensors((dir.path() / "merged.safetensors").string());
  ASSERT_EQ(merged.size(), want.size());
  for (auto& [name, t] : merged) {
    auto it = std::find_if(want.begin(), want.end(), [&](auto& e) { return e.first == name; });
    ASSERT_NE(it, want.end()) << name;
    EXPECT_TRUE(torch::equal(it->second, t)) << name;
  }
  // Strict names what differs; dtype converts.
  struct Bigger : torch::nn::Module {
    Bigger() { extra = register_parameter("extra", torch::zeros({2})); }
    torch::Tensor extra;
  };
  Bigger bigger;
  const std::string e = error_of([&] { hasten::load_weights(bigger, whole.string()); });
  EXPECT_NE(e.find("has no 'extra', which the module has (strict"), std::string::npos) << e;
  NetImpl half;
  half.to(torch::kDouble);
  hasten::load_weights(half, whole.string());
  EXPECT_TRUE(torch::equal(half.fc1->weight.to(torch::kFloat), want.front().second)) << want.front().first;
  EXPECT_NE(error_of([] { hasten::parse_size("ten GB"); }).find("'ten GB' is not a size"), std::string::npos);
}

// Saving the weights again into the same directory with fewer shards left the old shards
// next to an index that no longer named them.
TEST(Weights, SavingAgainRemovesTheShardsOfTheEarlierSave) {
  hasten::test::TempDir dir;
  hasten::test::isolate_home();
  Accelerator acc;
  auto model = acc.prepare(std::make_shared<NetImpl>());
  const fs::path out = dir.path() / "weights";
  acc.save_model(model, out.string(), "100B");  // one shard per tensor: 4
  ASSERT_TRUE(fs::exists(out / "model-00004-of-00004.safetensors"));
  acc.save_model(model, out.string(), "300B");
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(out)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                             "model.safetensors.index.json"}));
  acc.save_model(model, out.string());
  names.clear();
  for (auto& e : fs::directory_iterator(out)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"model.safetensors"}));
}

// A hand-edited hasten_state.json (checksums updated) with a field of the wrong type gave
// nlohmann's raw exception; load_state inside a loop over a prepared loader was accepted.
TEST(Checkpoint, AMalformedStateFileAndALoadInsideTheLoopAreClearErrors) {
  hasten::test::TempDir dir;
  const fs::path parts = dir.path() / "parts", b = dir.path() / "b";
  fs::create_directories(b);
  train("single", parts, 6, false, true, b);
  const fs::path ckpt = parts / "checkpoints" / "checkpoint_0";
  {
    Options o;
    o.project_dir = parts.string();
    Accelerator acc(o);
    auto net = std::make_shared<NetImpl>();
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
    torch::optim::StepLR steplr(adam, 3, 0.5);
    hasten::DataLoader data(hasten::TensorDataset(torch::randn({50, 6}), torch::randint(0, 3, {50})), {.batch_size = 4});
    auto [model, opt, loader, sched] = acc.prepare(net, adam, data, steplr);
    Counter micro;
    acc.register_for_checkpointing(micro);
    for (auto& batch : loader) {
      (void)batch;
      const std::string e = error_of([&] { acc.load_state(ckpt.string()); });
      EXPECT_NE(e.find("before the loop"), std::string::npos) << e;
      break;
    }
  }
  // world_size as text, with the manifest's size and checksum made to match.
  std::string text = hasten::test::TempDir::read_file(ckpt / "hasten_state.json");
  const auto at = text.rfind("\"world_size\":");  // the top-level key (keys are sorted)
  ASSERT_NE(at, std::string::npos) << text;
  const auto value = at + std::string("\"world_size\":").size();
  text.replace(value, text.find_first_of(",\n}", value) - value, " \"x\"");
  std::ofstream(ckpt / "hasten_state.json", std::ios::binary) << text;
  auto manifest = nlohmann::json::parse(hasten::test::TempDir::read_file(ckpt / "manifest.json"));
  auto& entry = manifest["files"]["hasten_state.json"];
  ASSERT_FALSE(entry.is_null()) << manifest.dump();
  entry["size"] = text.size();
  entry["crc32c"] = hasten::test::crc32c_text(text);
  std::ofstream(ckpt / "manifest.json") << manifest.dump();
  const std::string e = error_of([&] { train("single", parts, 10, false, false, b, ckpt.string()); });
  EXPECT_NE(e.find("hasten_state.json' is malformed: world_size must be an integer"), std::string::npos) << e;
}

// The checksum of a file larger than the stretches the CRC-32C runs side by side, and of an
// odd length, equals a bit-by-bit CRC-32C of its bytes.
TEST(Checkpoint, TheManifestChecksumOfALargeFileIsItsCrc32c) {
  hasten::test::TempDir dir;
  Options o;
  o.project_dir = dir.path().string();
  Accelerator acc(o);
  torch::manual_seed(5);
  torch::nn::Linear big(701, 401);  // about 1.1 MB of weights: many stretches, a remainder, two chunks
  auto prepared = acc.prepare(big);
  (void)prepared;
  const fs::path ckpt = acc.save_state();
  const auto manifest = nlohmann::json::parse(hasten::test::TempDir::read_file(ckpt / "manifest.json"));
  const std::string bytes = hasten::test::TempDir::read_file(ckpt / "model.safetensors");
  ASSERT_GT(bytes.size(), 1100000u);
  EXPECT_EQ(manifest["files"]["model.safetensors"]["crc32c"].get<std::string>(), hasten::test::crc32c_text(bytes));
  // And each 1 MiB chunk's, for the ranks that read only slices.
  const auto& chunks = manifest["files"]["model.safetensors"]["chunks"];
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].get<std::string>(), hasten::test::crc32c_text(bytes.substr(0, 1 << 20)));
  EXPECT_EQ(chunks[1].get<std::string>(), hasten::test::crc32c_text(bytes.substr(1 << 20)));
  EXPECT_EQ(acc.load_state(ckpt.string()), ckpt.string());
}

}  // namespace checkpoint_tests
