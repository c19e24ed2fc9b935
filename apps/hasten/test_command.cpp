// `hasten test [flags]`: Accelerate's `accelerate test`. Resolves the config as `hasten launch`
// does, starts hasten-selftest (installed next to `hasten`) on every process of it through the
// same launcher, and turns the ranks' verdicts into one line: what was checked and that it
// held, or which rank failed first and its error line.
#include <hasten/config.hpp>
#include <hasten/detail/launch_contract.hpp>
#include <hasten/error.hpp>
#include <hasten/registry.hpp>
#include <hasten/runtime_info.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "../cli_checks.hpp"
#include "commands.hpp"
#include "launcher.hpp"

namespace hasten::cli {

namespace {

namespace fs = std::filesystem;

struct TestFlags {
  std::string config_file;
  std::vector<std::pair<std::string, std::string>> set;
  int64_t steps = 60;
  bool verbose = false;
};

// hasten-selftest next to this executable (build/bin, the install's bin), else on PATH.
std::string find_selftest() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path beside = self.parent_path() / "hasten-selftest";
    if (::access(beside.c_str(), X_OK) == 0) return beside.string();
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / "hasten-selftest";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

std::string last_line_of(const fs::path& file) {
  std::ifstream in(file);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

std::string fixed(double v) {
  std::ostringstream o;
  o.precision(4);
  o << v;
  return o.str();
}

int run_test(const TestFlags& flags) {
  Options options;
  options.origin = "flag";
  if (!flags.config_file.empty()) options.config_file = flags.config_file;
  options.set = flags.set;
  const Environment env = current_environment();
  const Config config = resolve_as_workers(options, env);  // a bad key or value: its one line
  check_config_plugins(config);                         // an unknown strategy: its one line
  if (config.num_machines != 1)
    return report_error("test: num_machines is " + std::to_string(config.num_machines) +
                        "; hasten test runs the config's processes on this machine only (allowed: num_machines 1)");
  const std::string program = find_selftest();
  if (program.empty())
    return report_error("test: hasten-selftest not found next to hasten or on PATH (it is built and installed with hasten)");

  std::string pattern = (fs::temp_directory_path() / "hasten-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr)
    return report_error("test: cannot create a directory under " + fs::temp_directory_path().string());
  const fs::path dir = pattern;

  LaunchPlan plan;
  plan.command = {program, "--steps", std::to_string(flags.steps), "--result", dir.string()};
  plan.world_size = plan.local_world_size = config.num_processes;
  plan.master_addr = "127.0.0.1";
  plan.master_port = detail::pick_free_port(/*loopback_only=*/true);
  plan.run_token = detail::make_run_token();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = config.num_cpu_threads_per_process;
  if (threads == 0) threads = std::max(1, cores / std::max(1, plan.local_world_size));
  plan.env.emplace_back("OMP_NUM_THREADS", std::to_string(threads));
  plan.env.emplace_back("OPENBLAS_NUM_THREADS", std::to_string(threads));
  plan.env.emplace_back("HASTEN_CONFIG_JSON", config.explicit_json);
  if (env.count("OPENBLAS_CORETYPE") == 0) {
    const BlasAdvice advice = openblas_coretype_advice();
    if (!advice.coretype.empty()) plan.env.emplace_back("OPENBLAS_CORETYPE", advice.coretype);
  }
  plan.prefix_output = plan.world_size > 1;
  plan.log_dir = dir.string();
  plan.echo = flags.verbose;

  bool interrupted = false;
  int failed_rank = -1;
  const int rc = run_workers(plan, &interrupted, &failed_rank);
  if (interrupted) {
    fs::remove_all(dir);
    return rc;
  }

  std::vector<nlohmann::json> verdicts(static_cast<size_t>(plan.world_size));
  for (int r = 0; r < plan.world_size; ++r) {
    std::ifstream in(dir / ("rank_" + std::to_string(r) + ".json"));
    if (in) verdicts[static_cast<size_t>(r)] = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  auto ok = [](const nlohmann::json& v) { return v.is_object() && v.value("ok", false); };
  if (rc == 0 && std::all_of(verdicts.begin(), verdicts.end(), ok)) {
    const auto& v = verdicts[0];
    std::cout << "hasten test: ok, " << plan.world_size << " process" << (plan.world_size == 1 ? "" : "es")
              << ", strategy " << v.value("strategy", std::string("?")) << ", mixed precision "
              << v.value("mixed_precision", std::string("?")) << ", " << flags.steps << " steps, loss went from "
              << fixed(v.value("first_loss", 0.0)) << " to " << fixed(v.value("last_loss", 0.0))
              << (plan.world_size > 1 ? ", ranks agree" : "") << ", gather and reduce correct" << std::endl;
    fs::remove_all(dir);
    return 0;
  }
  // The rank to blame: the first whose process failed; else the first without a good verdict.
  int rank = failed_rank;
  if (rank < 0)
    for (int r = 0; r < plan.world_size && rank < 0; ++r)
      if (!ok(verdicts[static_cast<size_t>(r)])) rank = r;
  if (rank < 0) rank = 0;
  const auto& v = verdicts[static_cast<size_t>(rank)];
  std::string what;
  if (v.is_object() && v.contains("error"))
    what = v["error"].get<std::string>();
  else {
    const std::string last = last_line_of(dir / ("rank_" + std::to_string(rank) + ".log"));
    what = "ended with exit status " + std::to_string(rc == 0 ? 1 : rc) + " and no verdict" +
           (last.empty() ? std::string() : "; its last line: " + last);
  }
  report_error("test failed on rank " + std::to_string(rank) + " of " + std::to_string(plan.world_size) + ": " + what +
               " (every rank's output: " + (dir / "rank_<r>.log").string() + ")");
  return rc != 0 ? rc : 1;
}

}  // namespace

void add_test_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "test", "Run a short built-in training run with the config on all its processes and check the result");
  auto flags = std::make_shared<TestFlags>();
  cmd->add_option("--config_file,--config-file", flags->config_file, "Config file (YAML, Accelerate keys accepted)");
  struct KeyFlag {
    const char* names;
    const char* key;
    const char* help;
  };
  static const KeyFlag key_flags[] = {
      {"--num_processes,--num-processes", "num_processes", "Processes to run"},
      {"--mixed_precision,--mixed-precision", "mixed_precision", "no, fp16 or bf16"},
      {"--gradient_accumulation_steps,--gradient-accumulation-steps", "gradient_accumulation_steps",
       "Micro-batches per optimizer step"},
      {"--strategy", "strategy", "Strategy plugin name, preset or path"},
      {"--precision", "precision", "Precision plugin name or path"},
      {"--num_cpu_threads_per_process,--num-cpu-threads-per-process", "num_cpu_threads_per_process",
       "OMP_NUM_THREADS and OPENBLAS_NUM_THREADS of each process"},
  };
  for (const auto& f : key_flags)
    cmd->add_option_function<std::string>(
           f.names, [flags, key = std::string(f.key)](const std::string& v) { flags->set.emplace_back(key, v); }, f.help)
        ->type_name("VALUE");
  add_set_option(
      *cmd, [flags](std::string key, std::string value) { flags->set.emplace_back(std::move(key), std::move(value)); },
      "Any config key, KEY=VALUE with a YAML value (repeatable)");
  cmd->add_option("--steps", flags->steps, "Training steps (default 60)")->check(integer_in(10, 100000));
  cmd->add_flag("--verbose,-v", flags->verbose, "Show every rank's output");
  cmd->callback([&action, flags] { action = [flags] { return run_test(*flags); }; });
}

}  // namespace hasten::cli
