// hasten-test-trackers: logs a known sequence to the configured trackers (config from the
// usual sources: HASTEN_LOG_WITH, HASTEN_LOGGING_DIR, ...) so tests can read the files back.
//   init_trackers("trk", {lr: 0.001, model: "mlp", layers: 3, bf16: false})
//   steps 1..5: loss = 1/step and acc = step/10; step 3's loss is NaN, step 4's acc is +inf
//   log_text("notes", "hello **tracker**", 2)
//   then end_training(), or with --fail an exception leaves main before end_training;
//   with --hold FILE it first waits (idle, logging nothing) until FILE exists;
//   with --widen it then logs a new metric, extra = 1, at step 6 (a new column).
// --time N instead logs N calls of four scalars and prints how long the calls took (the
// per-log cost in docs/trackers.md), end_training's wait for the trackers included.
// --media instead logs, at steps 1 and 2 (test_tracker_media.py recomputes every value):
//   images "rgb" (float [3, 6, 8], (c * 48 + y * 8 + x) / 143), "grey" (uint8 [6, 8], y * 30 + x),
//   "rgba" (uint8 [5, 6, 4] HWC, (y * 12 + x * 4 + c) * 3);
//   histogram "weights" (linspace(-2, 3, 1001) * step, one NaN added), "counts" (int64 0..99),
//   "outliers" ([1e25, 1, -3e21, 0.5]: two beyond TensorFlow's buckets), "nothing" (3 NaN);
//   text "notes";
//   table "samples": columns [id, text, score], rows [1, "a|b", 0.5], [2, "c", -1].
// --bad-image logs a [5, 4, 6] image (neither CHW nor HWC).
// --init-kwargs NAME=MAPPING passes init_kwargs {NAME: MAPPING} to init_trackers.
// --get-tracker A,B,... instead prints, for each name, get_tracker's answer as lines
//   "tracker <rank> <name> blank=<0|1>" and "info <name> <key>=<value>", logs loss = 0.5 at
//   step 1 to every tracker and only = 1 at step 1 through the first name's handle, then prints "unknown: <message>" of get_tracker
//   of a name that is not running.
#include <hasten/hasten.hpp>

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  const bool fail = argc == 2 && std::string(argv[1]) == "--fail";
  const bool hold = argc == 3 && std::string(argv[1]) == "--hold";
  const bool timed = argc == 3 && std::string(argv[1]) == "--time";
  const bool widen = argc == 2 && std::string(argv[1]) == "--widen";
  const bool media = argc == 2 && std::string(argv[1]) == "--media";
  const bool bad_image = argc == 2 && std::string(argv[1]) == "--bad-image";
  hasten::TrackerKwargs kwargs;
  if (argc == 3 && std::string(argv[1]) == "--init-kwargs") {
    const std::string arg = argv[2];
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      std::cerr << "hasten-test-trackers: error: --init-kwargs takes NAME=MAPPING" << std::endl;
      return 2;
    }
    kwargs[arg.substr(0, eq)] = arg.substr(eq + 1);
  }
  const bool get_tracker = argc == 3 && std::string(argv[1]) == "--get-tracker";
  const long calls = timed ? std::strtol(argv[2], nullptr, 10) : 0;
  if ((argc > 1 && !fail && !hold && !timed && !widen && !media && !bad_image && !get_tracker && kwargs.empty()) ||
      (timed && calls <= 0)) {
    std::cerr << "hasten-test-trackers: error: the flags are --fail, --hold FILE, --widen, --media, --bad-image, "
                 "--get-tracker A,B and --time N (N >= 1)"
              << std::endl;
    return 2;
  }
  try {
    hasten::Accelerator acc;
    acc.init_trackers("trk", {{"lr", 0.001}, {"model", std::string("mlp")}, {"layers", int64_t{3}}, {"bf16", false}},
                      kwargs);
    if (timed) {
      const auto t0 = std::chrono::steady_clock::now();
      for (long i = 1; i <= calls; ++i)
        acc.log({{"loss", 1.0 / i}, {"acc", 0.5}, {"lr", 1e-3}, {"grad_norm", 2.0}}, i);
      const auto t1 = std::chrono::steady_clock::now();
      acc.end_training();
      const auto t2 = std::chrono::steady_clock::now();
      std::cout << "logged " << calls << " calls in " << std::chrono::duration<double>(t1 - t0).count()
                << " s, end_training " << std::chrono::duration<double>(t2 - t1).count() << " s" << std::endl;
      return 0;
    }
    if (get_tracker) {
      std::vector<std::string> names;
      std::stringstream list(argv[2]);
      for (std::string name; std::getline(list, name, ',');) names.push_back(name);
      for (const auto& name : names) {
        const hasten::TrackerHandle t = acc.get_tracker(name);
        std::cout << "tracker " << acc.process_index() << " " << t.name() << " blank=" << t.blank() << "\n";
        for (const auto& [key, value] : t.run_info()) std::cout << "info " << name << " " << key << "=" << value << "\n";
      }
      acc.log({{"loss", 0.5}}, 1);
      acc.get_tracker(names.at(0)).log({{"only", 1.0}}, 1);
      try {
        acc.get_tracker("nope");
      } catch (const hasten::UsageError& e) {
        std::cout << "unknown: " << e.what() << "\n";
      }
      acc.end_training();
      std::cout << "trackers: done" << std::endl;
      return 0;
    }
    if (media || bad_image) {
      if (bad_image) acc.log_images({{"bad", torch::zeros({5, 4, 6})}}, 1);
      for (int64_t step = 1; step <= 2; ++step) {
        const auto rgb = torch::arange(3 * 6 * 8, torch::kFloat).reshape({3, 6, 8}) / 143.0;
        const auto grey = (torch::arange(6).reshape({6, 1}) * 30 + torch::arange(8).reshape({1, 8})).to(torch::kUInt8);
        const auto rgba = ((torch::arange(5).reshape({5, 1, 1}) * 12 + torch::arange(6).reshape({1, 6, 1}) * 4 +
                            torch::arange(4).reshape({1, 1, 4})) * 3).to(torch::kUInt8);
        acc.log_images({{"rgb", rgb}, {"grey", grey}, {"rgba", rgba}}, step);
        auto weights = torch::linspace(-2, 3, 1001, torch::kDouble) * static_cast<double>(step);
        weights = torch::cat({weights, torch::tensor({std::nan("")}, torch::kDouble)});
        acc.log_histogram("weights", weights, step);
        acc.log_histogram("counts", torch::arange(100, torch::kLong), step);
        acc.log_histogram("outliers", torch::tensor({1e25, 1.0, -3e21, 0.5}, torch::kDouble), step);
        acc.log_histogram("nothing", torch::full({3}, std::nan(""), torch::kFloat), step);
        acc.log_text("notes", "step " + std::to_string(step), step);
        acc.log_table("samples", {"id", "text", "score"}, {{1.0, "a|b", 0.5}, {2.0, "c", -1.0}}, step);
        acc.log({{"loss", 1.0 / static_cast<double>(step)}}, step);
      }
      acc.end_training();
      std::cout << "trackers: done" << std::endl;
      return 0;
    }
    for (int64_t step = 1; step <= 5; ++step) {
      const double loss = step == 3 ? std::numeric_limits<double>::quiet_NaN() : 1.0 / static_cast<double>(step);
      const double acc_value = step == 4 ? std::numeric_limits<double>::infinity() : static_cast<double>(step) / 10.0;
      acc.log({{"loss", loss}, {"acc", acc_value}}, step);
      if (step == 2) acc.log_text("notes", "hello **tracker**", step);
      if (fail && step == 5) throw std::runtime_error("injected failure after step 5");
    }
    if (widen) acc.log({{"extra", 1.0}}, 6);
    if (hold) {
      std::cout << "trackers: holding" << std::endl;
      while (!std::filesystem::exists(argv[2])) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    acc.end_training();
    std::cout << "trackers: done" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "hasten-test-trackers: error: " << e.what() << std::endl;
    return 1;
  }
}
