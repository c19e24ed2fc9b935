// hasten-char-lm: a small character-level GPT (the gpt-tiny architecture of docs/workloads.md,
// sized for bytes) trained on the fortunes corpus with the loop of Accelerate's language-model
// fine-tuning example: bf16 autocast, gradient accumulation, AdamW with weight decay (none on
// biases and layer norms), a cosine schedule with linear warmup, gradient clipping on sync
// steps, checkpoints, a held-out validation loss, trackers, and generated text at the end.
// The lines marked "hasten" are the ones a plain LibTorch program would not have.
//
//   hasten-char-lm --max_steps 200 --project_dir runs/charlm
//   hasten launch --num_processes 2 build/bin/hasten-char-lm --max_steps 200 --project_dir runs/charlm
//   hasten-char-lm --files fortunes --init_from runs/pretrained --max_steps 50   # fine-tune
//   hasten launch --num_processes 2 build/bin/hasten-char-lm --set parallelism_config.parallelism_config_tp_size=2
//       # tensor parallelism: the model split over 2 processes (tp_gpt.hpp)
#include "char_lm.hpp"

#include <hasten/hasten.hpp>
#include <hasten/runtime_info.hpp>
#include <hasten/schedulers.hpp>
#include <hasten/tensor_parallel.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <iostream>

#include "char_lm_data.hpp"
#include "tp_gpt.hpp"
#include "workloads.hpp"

namespace F = torch::nn::functional;
namespace ex = hasten::examples;
using hasten::workloads::TinyGptImpl;

namespace {

using hasten::examples::char_lm::Args;

constexpr int64_t kVocab = 256;  // byte values: every file of any corpus encodes, and weights fit any --files


// Where the run is, saved in every checkpoint so that --resume continues there.
struct Progress {
  int64_t epoch = 0;  // epochs finished
  int64_t step = 0;   // optimizer steps taken
  std::string state_dict() const { return std::to_string(epoch) + " " + std::to_string(step); }
  void load_state_dict(const std::string& s) {
    const auto space = s.find(' ');
    epoch = std::stoll(s.substr(0, space));
    step = std::stoll(s.substr(space + 1));
  }
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Cross-entropy of the next byte at every position: logits (seq, batch, vocab), targets (seq,
// batch); the mean over all positions, or (kNone) each position's. Under tensor parallelism
// (`tp` given) the logits are this rank's slice of the vocabulary.
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets, const hasten::ProcessGroup* tp,
                      at::Reduction::Reduction reduction = at::Reduction::Mean) {
  const torch::Tensor flat = logits.reshape({-1, logits.size(-1)});
  if (tp != nullptr) return hasten::tp::vocab_parallel_cross_entropy(flat, targets.reshape(-1), *tp, reduction);
  if (reduction == at::Reduction::None)
    return F::cross_entropy(flat, targets.reshape(-1), F::CrossEntropyFuncOptions().reduction(torch::kNone));
  return F::cross_entropy(flat, targets.reshape(-1));
}

struct Eval {
  double loss = 0;
  int64_t count = 0;  // validation windows, each counted once over all processes
};

template <class Model, class Loader>
Eval evaluate(hasten::Accelerator& acc, Model& model, Loader& loader, const hasten::ProcessGroup* tp) {
  model.eval();
  torch::NoGradGuard no_grad;
  double sum = 0;
  int64_t count = 0;
  for (auto& b : loader) {
    const auto x = b["input_ids"].t(), y = b["labels"].t();  // sequence-first, as gpt-tiny takes it
    auto logits = model(x);
    auto per_token = lm_loss(logits, y, tp, at::Reduction::None);
    // hasten: one mean loss per window from every rank, less the windows that pad the last round.
    auto per_window = acc.gather_for_metrics(per_token.reshape(y.sizes()).mean(0));
    sum += per_window.sum().template item<double>();
    count += per_window.size(0);
  }
  model.train();
  return {count > 0 ? sum / static_cast<double>(count) : 0.0, count};
}

// Samples `n` bytes after `prompt` from a plain (unprepared, float32) copy of the model.
std::string generate(TinyGptImpl& net, const std::string& prompt, int64_t context, int64_t n, double temperature,
                     uint64_t seed) {
  torch::NoGradGuard no_grad;
  net.eval();
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<int64_t> tokens;
  for (unsigned char ch : prompt) tokens.push_back(ch);
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t begin = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - context);
    auto idx = torch::tensor(std::vector<int64_t>(tokens.begin() + begin, tokens.end()), torch::kLong).unsqueeze(1);
    auto logits = net.forward(idx)[-1][0];  // the last position's scores
    auto probs = torch::softmax(logits / temperature, 0);
    const int64_t next = torch::multinomial(probs, 1, false, gen).item<int64_t>();
    tokens.push_back(next);
    out.push_back(static_cast<char>(next));
  }
  return out;
}

int run_training(const Args& a, hasten::Options options) {
  const auto t0 = std::chrono::steady_clock::now();
  // Before the Accelerator: a missing corpus is reported at once, not after a rendezvous.
  const ex::Corpus corpus = ex::load_fortunes(a.data_dir, a.files, a.val_fraction);
  const double entropy = ex::unigram_entropy(corpus.train_text);
  const auto train_windows = ex::byte_windows(corpus.train_text, a.context);
  const auto val_windows = ex::byte_windows(corpus.val_text, a.context, a.val_windows);
  if (train_windows.size(0) == 0 || val_windows.size(0) == 0)
    throw ex::CorpusRequestError("--context " + std::to_string(a.context) +
                                 " is longer than the chosen files' training or validation text (" +
                                 std::to_string(corpus.train_text.size()) + " and " +
                                 std::to_string(corpus.val_text.size()) + " bytes)");
  if (a.resume) options.resume = "auto";
  options.gradient_accumulation_steps = static_cast<int>(a.accumulation);
  // Counted before the Accelerator: under sharded_init (zero3_init_flag) the layers built
  // after it hold only this rank's shards.
  const int64_t n_params = TinyGptImpl::parameter_count(kVocab, a.context, a.d_model, a.n_head, 4 * a.d_model, a.n_layer);
  hasten::Accelerator acc(options);  // hasten
  // Tensor parallelism (parallelism_config_tp_size > 1): the model trains split over the
  // mesh's tp group (tp_gpt.hpp); both ranks of a group read the same batches.
  const hasten::ProcessGroup tp_group = acc.device_mesh().group("tp");
  const hasten::ProcessGroup* tp = tp_group.size() > 1 ? &tp_group : nullptr;
  const int64_t data_ranks = acc.device_mesh().size("dp");  // the processes that read different windows
  if (tp != nullptr && a.gradient_checkpointing)
    throw hasten::UsageError("--gradient_checkpointing: not under tensor parallelism (tp " +
                             std::to_string(tp_group.size()) + "): the split model's blocks are not checkpointing units");
  torch::set_num_threads(a.threads);
  hasten::set_blas_threads(a.threads);  // the BLAS's pool: MKL follows LibTorch's, an OpenBLAS has its own
  torch::manual_seed(a.seed);
  const double start_rss_mb = hasten::workloads::rss_mb();  // the process before the model
  // Sharding strategies gather and free one encoder layer at a time; checkpointing recomputes
  // one at a time: the layers are units for both.
  const bool units = acc.strategy() == "zero" || acc.strategy() == "fsdp" || a.gradient_checkpointing;
  auto net = std::make_shared<TinyGptImpl>(kVocab, a.context, a.d_model, a.n_head, 4 * a.d_model, a.n_layer, units);
  if (!a.init_from.empty()) hasten::load_weights(*net, a.init_from);  // hasten: from_pretrained
  // What trains: the model, or this rank's part of it (made from the whole, then dropped).
  std::shared_ptr<hasten::workloads::ModelImpl> trained = net;
  if (tp != nullptr) {
    trained = hasten::workloads::TpGpt(*net, tp_group).ptr();
    net.reset();
  }

  // Weight decay on the weight matrices and embeddings, none on biases and layer norms (as
  // Accelerate's example excludes "bias" and "LayerNorm.weight").
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : trained->named_parameters())
    (ends_with(p.key(), "bias") || p.key().find("norm") != std::string::npos ? no_decay : decay).push_back(p.value());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(a.lr).weight_decay(a.weight_decay)));
  groups.emplace_back(no_decay,
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(a.lr).weight_decay(0.0)));
  torch::optim::AdamW adamw(std::move(groups), torch::optim::AdamWOptions(a.lr).weight_decay(a.weight_decay));

  using torch::indexing::Slice;
  // Batches of named tensors: input_ids and labels (the next byte of each position).
  hasten::DataLoader train_data(ex::TokenWindows(train_windows),
                                {.batch_size = a.batch_size, .shuffle = true, .seed = a.seed, .num_workers = a.num_workers});
  hasten::DataLoader val_data(ex::TokenWindows(val_windows), {.batch_size = a.eval_batch_size, .num_workers = a.num_workers});
  // Recompute each transformer block's activations in backward instead of keeping them.
  if (a.gradient_checkpointing) acc.checkpoint_activations(net);  // hasten
  // High-water marks of the process: the model built (whole, or sharded under sharded_init),
  // then prepared.
  const double built_rss_mb = hasten::workloads::peak_rss_mb();
  auto [model, opt, train_loader, val_loader] = acc.prepare(trained, adamw, train_data, val_data);  // hasten
  const double prepared_rss_mb = hasten::workloads::peak_rss_mb();

  // Optimizer steps this process takes: per epoch its batches over the accumulation, rounded
  // up (the last batch of an epoch always steps).
  const int64_t accum = acc.gradient_accumulation_steps();
  const int64_t steps_per_epoch = (static_cast<int64_t>(train_loader.size()) + accum - 1) / accum;
  int64_t total_steps = a.epochs * steps_per_epoch;
  if (a.max_steps > 0) total_steps = std::min(total_steps, a.max_steps);
  const int64_t warmup = a.warmup_steps >= 0 ? a.warmup_steps : total_steps / 10;
  // A run of no steps (--epochs 0: evaluate loaded weights) still builds a valid schedule.
  auto cosine = hasten::schedulers::cosine_with_warmup(adamw, warmup, std::max(total_steps, warmup + 1));
  auto schedule = acc.prepare(cosine);  // hasten

  const bool tracking = !acc.config().trackers.empty();
  if (tracking)
    acc.init_trackers("char-lm", {{"lr", a.lr},
                                  {"weight_decay", a.weight_decay},
                                  {"batch_size", a.batch_size},
                                  {"gradient_accumulation_steps", accum},
                                  {"context", a.context},
                                  {"d_model", a.d_model},
                                  {"n_layer", a.n_layer},
                                  {"max_steps", a.max_steps},
                                  {"num_processes", int64_t{acc.num_processes()}},
                                  {"tp_size", int64_t{tp_group.size()}},
                                  {"strategy", acc.strategy()},
                                  {"mixed_precision", acc.mixed_precision()},
                                  {"init_from", a.init_from}});
  Progress progress;
  acc.register_for_checkpointing(progress);
  const std::string resumed_from = acc.resumed_from();  // applies resume: auto now
  if (!a.json) {
    acc.print("corpus: ", corpus.files.size(), " file(s), ", corpus.fortunes, " fortunes (", corpus.val_fortunes,
              " held out), ", corpus.train_text.size(), " training bytes, unigram entropy ", entropy, " nats/char");
    acc.print("model: ", a.n_layer, " layers, width ", a.d_model, ", context ", a.context, ", ",
              n_params,
              " parameters; ", total_steps, " optimizer steps of ", a.batch_size * accum * data_ranks,
              " windows; ", acc.strategy(), ", ", acc.mixed_precision());
    if (!resumed_from.empty())
      acc.print("resumed from ", resumed_from, " at epoch ", progress.epoch, ", step ", progress.step);
  }

  const int64_t per_step = a.batch_size * accum * data_ranks;  // windows per optimizer step
  double train_s = 0;  // in the training loops only: samples/s leaves evaluation and saving out
  int64_t steps_this_run = 0;
  Eval last;
  std::string checkpoint;
  const auto limit_reached = [&] { return a.max_steps > 0 && progress.step >= a.max_steps; };
  // The process's high-water mark while it trained: taken before its first checkpoint, since a
  // save gathers whole tensors on rank 0 (under tp, the split model's and its optimizer's).
  double training_peak_rss_mb = 0;
  const auto save_state = [&] {
    if (training_peak_rss_mb == 0) training_peak_rss_mb = hasten::workloads::peak_rss_mb();
    return acc.save_state();  // hasten: <project_dir>/checkpoints/checkpoint_<N>
  };
  double loss_sum = 0;  // this window's micro-batch losses
  int64_t micro = 0;
  while (progress.epoch < a.epochs && !limit_reached()) {
    int64_t total = steps_per_epoch;
    if (a.max_steps > 0) total = std::min(total, a.max_steps - progress.step);
    hasten::ProgressOptions po;
    po.description = "epoch " + std::to_string(progress.epoch + 1) + "/" + std::to_string(a.epochs);
    po.enabled = acc.is_local_main_process() && !a.quiet && !a.json;
    hasten::ProgressBar bar(total, po);
    bool stopped = false;
    auto t_train = std::chrono::steady_clock::now();
    for (auto& batch : train_loader) {
      auto scope = acc.accumulate(model);  // hasten
      const auto x = batch["input_ids"].t(), y = batch["labels"].t();
      auto loss = lm_loss(model(x), y, tp);  // the prepared model's forward runs under bf16 autocast
      acc.backward(loss);  // hasten: instead of loss.backward(); divides by the window's length
      loss_sum += loss.item<double>(), ++micro;
      double grad_norm = 0;
      if (acc.sync_gradients()) grad_norm = acc.clip_grad_norm_(model, a.max_grad_norm);  // hasten
      opt.step();  // no-ops on accumulation micro-batches
      schedule.step();
      opt.zero_grad();
      if (!acc.sync_gradients()) continue;
      ++progress.step, ++steps_this_run;
      const double l = loss_sum / static_cast<double>(micro);
      loss_sum = 0, micro = 0;
      bar.set("loss", l);
      bar.update(1, per_step);
      if (tracking && a.log_every > 0 && progress.step % a.log_every == 0)
        acc.log({{"train_loss", l}, {"grad_norm", grad_norm}, {"lr", schedule->get_last_lr().front()}}, progress.step);
      stopped = limit_reached();
      // Saved inside the loop, the loader's position is kept: --resume continues mid-epoch.
      if ((a.checkpoint_every > 0 && progress.step % a.checkpoint_every == 0) || stopped) {
        train_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_train).count();
        checkpoint = save_state();
        t_train = std::chrono::steady_clock::now();
      }
      if (stopped) break;
    }
    train_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_train).count();
    bar.close();
    last = evaluate(acc, model, val_loader, tp);
    if (!stopped) ++progress.epoch;
    if (!a.json)
      acc.print(stopped ? "stopped in epoch " : "epoch ", stopped ? progress.epoch + 1 : progress.epoch, "/", a.epochs,
                ": validation loss ", last.loss, " nats/char over ", last.count, " windows, step ", progress.step);
    if (tracking) acc.log({{"val_loss", last.loss}, {"epoch", double(progress.epoch)}}, progress.step);
    if (!stopped) checkpoint = save_state();  // one per epoch
  }
  if (last.count == 0) last = evaluate(acc, model, val_loader, tp);  // nothing trained in this run
  if (tracking) acc.end_training();
  if (!a.save_model.empty()) acc.save_model(model, a.save_model);  // hasten: HF layout, for --init_from

  // The full weights on the main process (every rank takes part: sharded strategies gather),
  // for the checksum and for sampling from a plain float32 copy of the model.
  // Under tp the split model's whole tensors, under the one-process model's names (tp_gpt.hpp).
  const auto state = acc.get_state_dict(model);  // hasten
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double samples_per_s = train_s > 0 ? static_cast<double>(steps_this_run * per_step) / train_s : 0.0;
  if (!acc.is_main_process()) return 0;
  const std::string checksum = hasten::param_checksum(state);
  std::string sample;
  if (a.sample_chars > 0) {
    auto plain = std::make_shared<TinyGptImpl>(kVocab, a.context, a.d_model, a.n_head, 4 * a.d_model, a.n_layer, false);
    auto params = plain->named_parameters();
    torch::NoGradGuard no_grad;
    for (const auto& [name, tensor] : state) params[name].copy_(tensor);
    // Fortunes follow a line holding only "%": start there, then the prompt.
    sample = a.prompt + generate(*plain, "%\n" + a.prompt, a.context, a.sample_chars, a.temperature, a.seed);
  }
  if (a.json) {
    nlohmann::ordered_json j{{"val_loss", last.loss},
                             {"unigram_entropy", entropy},
                             {"val_windows", last.count},
                             {"train_bytes", corpus.train_text.size()},
                             {"val_bytes", corpus.val_text.size()},
                             {"files", corpus.files},
                             {"epochs", progress.epoch},
                             {"steps", progress.step},
                             {"seconds", seconds},
                             {"train_seconds", train_s},
                             {"samples_per_s", samples_per_s},
                             {"chars_per_s", samples_per_s * static_cast<double>(a.context)},
                             {"num_processes", acc.num_processes()},
                             {"tp_size", tp_group.size()},
                             {"strategy", acc.strategy()},
                             {"mixed_precision", acc.mixed_precision()},
                             {"param_checksum", checksum},
                             {"gradient_checkpointing", a.gradient_checkpointing},
                             {"peak_rss_mb", hasten::workloads::peak_rss_mb()},
                             {"peak_rss_training_mb", training_peak_rss_mb > 0 ? training_peak_rss_mb
                                                                               : hasten::workloads::peak_rss_mb()},
                             {"rss_before_model_mb", start_rss_mb},
                             {"peak_rss_built_mb", built_rss_mb},
                             {"peak_rss_prepared_mb", prepared_rss_mb},
                             {"checkpoint", checkpoint},
                             {"resumed_from", resumed_from},
                             {"init_from", a.init_from},
                             {"sample", sample}};
    // Sampled bytes need not be UTF-8: replace what is not, rather than throw.
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  } else {
    if (!sample.empty()) std::cout << "--- sample (seed " << a.seed << ", temperature " << a.temperature << ")\n" << sample << "\n---\n";
    std::cout << "done: validation loss " << last.loss << " nats/char (unigram entropy " << entropy << ") after "
              << progress.step << " steps, " << std::llround(samples_per_s) << " samples/s, " << seconds << " s"
              << std::endl;
  }
  return 0;
}

}  // namespace

namespace hasten::examples::char_lm {

int train(const Args& a, hasten::Options options) { return run_training(a, std::move(options)); }

}  // namespace hasten::examples::char_lm
