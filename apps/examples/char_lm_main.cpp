// hasten-char-lm's command line (char_lm.cpp holds the training).
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "char_lm.hpp"
#include "char_lm_data.hpp"

namespace {

using hasten::examples::char_lm::Args;
using hasten::examples::char_lm::train;
namespace ex = hasten::examples;

// CLI11's own range checks print the type's whole range; these say what is allowed in words.
CLI::Validator whole_number(int64_t min) {
  return CLI::Validator(
      [min](std::string& s) -> std::string {
        try {
          size_t used = 0;
          if (std::stoll(s, &used) >= min && used == s.size()) return {};
        } catch (const std::exception&) {
        }
        return "expects a whole number >= " + std::to_string(min) + ", got '" + s + "'";
      },
      "INT>=" + std::to_string(min));
}

// A number in (lo, hi) (hi < 0: no upper bound).
CLI::Validator real_in(double lo, double hi) {
  const std::string range = hi < 0 ? "> " + CLI::detail::to_string(lo) : "in (" + CLI::detail::to_string(lo) + ", " + CLI::detail::to_string(hi) + ")";
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        try {
          size_t used = 0;
          const double v = std::stod(s, &used);
          if (used == s.size() && v > lo && (hi < 0 || v < hi)) return {};
        } catch (const std::exception&) {
        }
        return "expects a number " + range + ", got '" + s + "'";
      },
      "NUMBER");
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"hasten-char-lm: train a character-level GPT on the fortunes corpus through hasten"};
  app.add_option("--epochs", a.epochs, "Passes over the training text (0: only evaluate and sample the initial weights)")
      ->check(whole_number(0));
  app.add_option("--max_steps,--max-steps", a.max_steps, "Stop after this many optimizer steps in all (0: no limit)")
      ->check(whole_number(0));
  app.add_option("--batch_size,--batch-size", a.batch_size, "Per-process micro-batch, in windows of --context bytes")
      ->check(whole_number(1));
  app.add_option("--eval_batch_size,--eval-batch-size", a.eval_batch_size, "Per-process batch of the validation")
      ->check(whole_number(1));
  app.add_option("--gradient_accumulation_steps,--gradient-accumulation-steps", a.accumulation,
                 "Micro-batches per optimizer step")
      ->check(whole_number(1));
  app.add_option("--context", a.context, "Bytes of context the model sees")->check(whole_number(1));
  app.add_option("--d_model,--d-model", a.d_model, "Width of the transformer")->check(whole_number(1));
  app.add_option("--n_layer,--n-layer", a.n_layer, "Encoder layers")->check(whole_number(1));
  app.add_option("--n_head,--n-head", a.n_head, "Attention heads (must divide --d_model)")->check(whole_number(1));
  app.add_option("--lr", a.lr, "AdamW's peak learning rate")->check(real_in(0, -1));
  app.add_option("--weight_decay,--weight-decay", a.weight_decay, "AdamW's weight decay (not on biases and norms)")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            try {
              size_t used = 0;
              if (std::stod(s, &used) >= 0 && used == s.size()) return {};
            } catch (const std::exception&) {
            }
            return "expects a number >= 0, got '" + s + "'";
          },
          "NUMBER>=0"));
  app.add_option("--warmup_steps,--warmup-steps", a.warmup_steps,
                 "Linear warmup before the cosine decay, in optimizer steps (default: a tenth of them)")
      ->check(whole_number(0));
  app.add_option("--max_grad_norm,--max-grad-norm", a.max_grad_norm, "Clip the gradients' global norm on every step")
      ->check(real_in(0, -1));
  app.add_option("--val_fraction,--val-fraction", a.val_fraction, "Fraction of the fortunes held out, evenly spread")
      ->check(real_in(0, 1));
  app.add_option("--val_windows,--val-windows", a.val_windows,
                 "Validation windows, evenly spaced over the held-out text (0: all)")
      ->check(whole_number(0));
  app.add_option("--seed", a.seed, "Seed of the initial weights, the shuffle order and the sampling");
  app.add_option("--num_workers,--num-workers", a.num_workers,
                 "Data loader worker threads that read batches ahead (0: the training thread reads them)")
      ->check(whole_number(0));
  app.add_option("--threads", a.threads, "Intra-op threads per process (LibTorch's pool, which sizes MKL's; an OpenBLAS's own pool)")->check(whole_number(1));
  app.add_option("--log_every,--log-every", a.log_every, "Log loss, gradient norm and lr every N steps (0: off)")
      ->check(whole_number(0));
  app.add_option("--checkpoint_every,--checkpoint-every", a.checkpoint_every,
                 "Also save a checkpoint every N optimizer steps (0: at the end of each epoch and of the run only)")
      ->check(whole_number(0));
  app.add_option("--sample_chars,--sample-chars", a.sample_chars, "Bytes of text to generate at the end (0: none)")
      ->check(whole_number(0));
  app.add_option("--temperature", a.temperature, "Sampling temperature")->check(real_in(0, -1));
  app.add_option("--prompt", a.prompt, "Text the generated fortune starts with");
  app.add_option("--data_dir,--data-dir", a.data_dir, "Directory of the fortune files");
  app.add_option("--files", a.files, "Corpus files to use, by name (default: all); comma-separated or repeated")
      ->delimiter(',');
  app.add_option("--init_from,--init-from", a.init_from,
                 "Start from weights written by save_model (a directory or .safetensors file) or a checkpoint");
  app.add_option("--save_model,--save-model", a.save_model, "Write the final weights here (save_model)");
  std::string project_dir, config_file, mp = "bf16", strategy;
  std::vector<std::string> trackers, sets;
  app.add_option("--project_dir,--project-dir", project_dir,
                 "Checkpoints (<dir>/checkpoints) and tracker logs (<dir>/hasten_logs); default: the config's");
  app.add_flag("--resume", a.resume, "Continue from the newest complete checkpoint under <project_dir>, if any");
  app.add_flag("--gradient_checkpointing,--gradient-checkpointing", a.gradient_checkpointing,
               "Keep no activations of the transformer blocks: recompute them in backward (less memory, more time)");
  app.add_flag("--json", a.json, "Print only a JSON summary line (main process)");
  app.add_flag("--quiet", a.quiet, "No progress bar");
  app.add_option("--config_file,--config-file", config_file, "hasten config file");
  app.add_option("--mixed_precision,--mixed-precision", mp, "no, bf16 or fp16 (set in code: overrides the config's)")
      ->capture_default_str();
  app.add_option("--strategy", strategy, "Strategy plugin (single, ddp, zero1-3, fsdp...)");
  app.add_option("--trackers,--log_with", trackers, "Tracker plugins (e.g. csv jsonl)");
  app.add_option("--set", sets, "Any config key, KEY=VALUE (repeatable)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "hasten-char-lm: error: " << e.what() << " (see --help)" << std::endl;
    return 2;
  }
  if (a.d_model % a.n_head != 0) {
    std::cerr << "hasten-char-lm: error: --n_head " << a.n_head << " does not divide --d_model " << a.d_model
              << " (each head gets d_model / n_head dimensions)" << std::endl;
    return 2;
  }
  hasten::Options options;
  for (const auto& kv : sets) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) {
      std::cerr << "hasten-char-lm: error: --set expects KEY=VALUE, got '" << kv << "'" << std::endl;
      return 2;
    }
    options.set.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  if (!project_dir.empty()) options.project_dir = project_dir;
  if (!config_file.empty()) options.config_file = config_file;
  options.mixed_precision = mp;
  if (!strategy.empty()) options.strategy = strategy;
  if (!trackers.empty()) options.trackers = trackers;
  try {
    return train(a, options);
  } catch (const ex::CorpusMissing& e) {
    std::cerr << "hasten-char-lm: error: " << e.what() << std::endl;
    return 3;
  } catch (const ex::CorpusRequestError& e) {
    std::cerr << "hasten-char-lm: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "hasten-char-lm: error: " << e.what() << std::endl;
    return 1;
  }
}
