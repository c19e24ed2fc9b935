// hasten-fashion-mnist: a small CNN (two convolution + max-pooling blocks, as in the published
// baselines of Fashion-MNIST) trained with the loop of the README, evaluated on the 10,000 test
// images every epoch, checkpointed every epoch. The lines marked "hasten" are the ones a plain
// LibTorch program would not have.
//
//   hasten-fashion-mnist --epochs 2 --project_dir runs/fmnist
//   hasten launch --num_processes 2 build/bin/hasten-fashion-mnist --epochs 2 --project_dir runs/fmnist
#include "fashion_mnist.hpp"

#include <hasten/hasten.hpp>
#include <hasten/runtime_info.hpp>
#include <hasten/schedulers.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <iostream>

#include "fashion_mnist_data.hpp"

namespace F = torch::nn::functional;
using hasten::examples::load_fashion_mnist;

namespace {

using hasten::examples::fashion::Args;

// 28x28 -> conv 5x5 (16) -> pool -> conv 5x5 (32) -> pool -> 128 -> 10 logits: 0.2M parameters,
// small enough for two epochs on two CPU cores in a few minutes.
struct CnnImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 16, 5).padding(2)};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(16, 32, 5).padding(2)};
  torch::nn::Linear fc1{32 * 7 * 7, 128};
  torch::nn::Linear fc2{128, 10};
  CnnImpl() {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = F::max_pool2d(torch::relu(conv1(x)), F::MaxPool2dFuncOptions(2));
    x = F::max_pool2d(torch::relu(conv2(x)), F::MaxPool2dFuncOptions(2));
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
};

// Where the run is, saved in every checkpoint so that --resume continues at the next epoch.
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


struct Eval {
  double accuracy = 0, loss = 0;
  int64_t count = 0;
};

template <class Model, class Loader>
Eval evaluate(hasten::Accelerator& acc, Model& model, Loader& loader) {
  model.eval();
  torch::NoGradGuard no_grad;
  int64_t correct = 0, count = 0;
  double loss_sum = 0;
  for (auto& b : loader) {
    auto logits = model(b.input);
    // hasten: every rank's predictions, less the samples that pad the last round, so each
    // test image counts exactly once whatever the number of processes.
    auto preds = acc.gather_for_metrics(logits.argmax(1));
    auto targets = acc.gather_for_metrics(b.target);
    auto losses = acc.gather_for_metrics(F::cross_entropy(logits, b.target, F::CrossEntropyFuncOptions().reduction(torch::kNone)));
    correct += preds.eq(targets).sum().template item<int64_t>();
    count += preds.size(0);
    loss_sum += losses.sum().template item<double>();
  }
  model.train();
  return {count > 0 ? static_cast<double>(correct) / static_cast<double>(count) : 0.0,
          count > 0 ? loss_sum / static_cast<double>(count) : 0.0, count};
}

// Fashion-MNIST's ten classes, in label order.
const char* const kClassNames[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                     "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

// The first `count` test images side by side as one picture, and a table of what the model
// guesses for each: the trackers that keep images and tables (tensorboard, mlflow) show how the
// guesses change from epoch to epoch. Every rank runs the forward (a sharded model gathers its
// parameters in it); only the main process's log reaches the trackers.
template <class Model>
void log_samples(hasten::Accelerator& acc, Model& model, const torch::Tensor& images, const torch::Tensor& labels,
                 int64_t count, int64_t step) {
  auto batch = images.slice(0, 0, count);
  torch::Tensor guesses;
  {
    model.eval();
    torch::NoGradGuard no_grad;
    guesses = model(batch.to(acc.device())).argmax(1).cpu();
    model.train();
  }
  // The images are normalised (mean 0, std 1): back to 0-1 for the picture.
  auto strip = torch::cat(batch.unbind(0), /*dim=*/2);  // [1, 28, 28 * count]
  strip = (strip - strip.min()) / (strip.max() - strip.min()).clamp_min(1e-6);
  acc.log_images({{"test_samples", strip}}, step);
  std::vector<std::vector<hasten::TableCell>> rows;
  for (int64_t i = 0; i < count; ++i) {
    const auto label = labels[i].item<int64_t>(), guess = guesses[i].item<int64_t>();
    rows.push_back({std::to_string(i), kClassNames[label], kClassNames[guess], guess == label ? "yes" : "no"});
  }
  acc.log_table("test_guesses", {"image", "label", "guess", "right"}, rows, step);
}

int run_training(const Args& a, hasten::Options options) {
  const auto t0 = std::chrono::steady_clock::now();
  // Before the Accelerator: a missing data set is reported at once, not after a rendezvous.
  const auto data = load_fashion_mnist(a.data_dir);
  if (a.resume) options.resume = "auto";
  hasten::Accelerator acc(options);  // hasten
  torch::set_num_threads(a.threads);
  hasten::set_blas_threads(a.threads);  // the BLAS's pool: MKL follows LibTorch's, an OpenBLAS has its own
  torch::manual_seed(a.seed);
  auto net = std::make_shared<CnnImpl>();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(a.lr));
  // The lr decays along a half cosine to 0 at the last step, as Accelerate's examples decay
  // theirs (transformers' schedules): small steps at the end settle the weights, so a short
  // run ends more accurate. Each rank's batches per epoch: ceil(60000 / global batch).
  const int64_t global_batch = a.batch_size * acc.num_processes();
  int64_t total_steps = a.epochs * ((data.train_images.size(0) + global_batch - 1) / global_batch);
  if (a.max_steps > 0) total_steps = std::min(total_steps, a.max_steps);
  auto cosine = hasten::schedulers::cosine_with_warmup(adam, /*warmup=*/0, total_steps);
  hasten::DataLoader train_data(hasten::TensorDataset(data.train_images, data.train_labels),
                                {.batch_size = a.batch_size, .shuffle = true, .seed = a.seed});
  hasten::DataLoader test_data(hasten::TensorDataset(data.test_images, data.test_labels),
                               {.batch_size = a.eval_batch_size});
  auto [model, opt, train_loader, test_loader, schedule] = acc.prepare(net, adam, train_data, test_data, cosine);  // hasten

  const bool tracking = !acc.config().trackers.empty();
  if (tracking)
    acc.init_trackers("fashion-mnist", {{"lr", a.lr},
                                        {"batch_size", a.batch_size},
                                        {"epochs", a.epochs},
                                        {"max_steps", a.max_steps},
                                        {"num_processes", int64_t{acc.num_processes()}},
                                        {"strategy", acc.strategy()},
                                        {"mixed_precision", acc.mixed_precision()}});
  Progress progress;
  acc.register_for_checkpointing(progress);
  const std::string resumed_from = acc.resumed_from();  // applies resume: auto now
  if (!resumed_from.empty() && !a.json)
    acc.print("resumed from ", resumed_from, " after epoch ", progress.epoch, " (step ", progress.step, ")");

  const auto per_step = global_batch;
  double train_s = 0;  // in the training loops only: samples/s leaves evaluation and saving out
  int64_t steps_this_run = 0;
  Eval last;
  std::string checkpoint;
  bool stopped = false;  // SIGTERM/SIGUSR1 (scancel, preemption): a final checkpoint, then return
  const auto limit_reached = [&] { return a.max_steps > 0 && progress.step >= a.max_steps; };
  while (progress.epoch < a.epochs && !limit_reached() && !stopped) {
    int64_t total = static_cast<int64_t>(train_loader.size());
    if (a.max_steps > 0) total = std::min(total, a.max_steps - progress.step);
    hasten::ProgressOptions po;
    po.description = "epoch " + std::to_string(progress.epoch + 1) + "/" + std::to_string(a.epochs);
    po.enabled = acc.is_local_main_process() && !a.quiet && !a.json;
    hasten::ProgressBar bar(total, po);
    const auto t_epoch = std::chrono::steady_clock::now();
    for (auto& batch : train_loader) {
      auto scope = acc.accumulate(model);  // hasten
      auto loss = F::cross_entropy(model(batch.input), batch.target);
      acc.backward(loss);  // hasten: instead of loss.backward()
      opt.step();
      schedule.step();
      opt.zero_grad();
      ++progress.step, ++steps_this_run;
      const double l = loss.item<double>();
      bar.set("loss", l);
      bar.update(1, per_step);
      if (tracking && a.log_every > 0 && progress.step % a.log_every == 0) acc.log({{"train_loss", l}}, progress.step);
      if (limit_reached()) break;
      if ((stopped = acc.stop_requested())) break;  // hasten: every rank stops at this step
    }
    train_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_epoch).count();
    bar.close();
    if (stopped) {  // mid-epoch: the checkpoint keeps the loader's position
      checkpoint = acc.save_state();
      if (!a.json) acc.print("stopped by a signal at step ", progress.step, ": saved ", checkpoint);
      break;
    }
    last = evaluate(acc, model, test_loader);
    ++progress.epoch;
    if (!a.json)
      acc.print("epoch ", progress.epoch, "/", a.epochs, ": test accuracy ", last.accuracy, " (",
                static_cast<int64_t>(std::llround(last.accuracy * static_cast<double>(last.count))), "/", last.count,
                "), test loss ", last.loss, ", step ", progress.step);
    if (tracking)
      acc.log({{"test_accuracy", last.accuracy}, {"test_loss", last.loss}, {"epoch", double(progress.epoch)}},
              progress.step);
    if (tracking && a.log_samples > 0)
      log_samples(acc, model, data.test_images, data.test_labels, a.log_samples, progress.step);
    checkpoint = acc.save_state();  // hasten: <project_dir>/checkpoints/checkpoint_<N>
  }
  if (last.count == 0 && !stopped && !a.json)  // resumed after the last epoch: nothing left to train
    acc.print("nothing to do: ", progress.epoch, " of ", a.epochs, " epochs already done");
  if (last.count == 0 && !stopped) last = evaluate(acc, model, test_loader);
  if (tracking) acc.end_training();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double samples_per_s = train_s > 0 ? static_cast<double>(steps_this_run * per_step) / train_s : 0.0;
  if (!acc.is_main_process()) return 0;
  if (a.json) {
    nlohmann::ordered_json j{{"test_accuracy", last.accuracy}, {"test_loss", last.loss},
                             {"eval_count", last.count},       {"epochs", progress.epoch},
                             {"steps", progress.step},         {"seconds", seconds},
                             {"train_seconds", train_s},       {"samples_per_s", samples_per_s},
                             {"num_processes", acc.num_processes()}, {"strategy", acc.strategy()},
                             {"checkpoint", checkpoint},       {"resumed_from", resumed_from},
                             {"stopped", stopped}};
    std::cout << j.dump() << std::endl;
  } else {
    std::cout << "done: test accuracy " << last.accuracy << " on " << last.count << " images after "
              << progress.epoch << " epoch(s), " << progress.step << " steps, " << std::llround(samples_per_s)
              << " samples/s, " << seconds << " s" << std::endl;
  }
  return 0;
}

}  // namespace

namespace hasten::examples::fashion {

int train(const Args& a, hasten::Options options) { return run_training(a, std::move(options)); }

}  // namespace hasten::examples::fashion
