// `hasten launch [flags] PROGRAM [ARGS...]`: resolves the config (file, environment, flags),
// then starts this machine's workers with the torchrun environment contract and the resolved
// config in HASTEN_CONFIG_JSON.
#include <hasten/config.hpp>
#include <hasten/detail/launch_contract.hpp>
#include <hasten/error.hpp>
#include <hasten/process.hpp>
#include <hasten/registry.hpp>
#include <hasten/runtime_info.hpp>

#include <nlohmann/json.hpp>

#include "../cli_checks.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "commands.hpp"
#include "launcher.hpp"
#include "machine_agents.hpp"

namespace hasten::cli {

namespace {

struct LaunchFlags {
  std::string config_file;
  std::vector<std::pair<std::string, std::string>> set;  // config key -> flag text
  bool dry_run = false;
  double grace_s = 5.0;
  std::vector<std::string> command;
  std::vector<std::string> known_flags;  // "--num_processes", ... (for a misspelt flag's message)
};

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_of(" \t\n'\"\\$`*?&;|<>(){}[]!#~") == std::string::npos) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The program as execvp would find it, or "" when it cannot run.
std::string resolve_program(const std::string& name) {
  auto runnable = [](const std::string& p) { return ::access(p.c_str(), X_OK) == 0 && !std::filesystem::is_directory(p); };
  if (name.find('/') != std::string::npos) return runnable(name) ? name : "";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (runnable(candidate)) return candidate;
  }
  return "";
}

// A word before PROGRAM that looks like a flag is a flag hasten launch does not have (a
// misspelling such as --num_process), not a program to run.
std::string unknown_flag_message(const std::string& word, const std::vector<std::string>& known) {
  std::string name = word.substr(0, word.find('='));
  auto canonical = [](std::string s) {
    s.erase(0, s.find_first_not_of('-'));
    for (auto& c : s) c = c == '-' ? '_' : c;
    return s;
  };
  const std::string given = canonical(name);
  std::string near;
  for (auto& k : known) {
    const std::string c = canonical(k);
    if (near.empty() && !given.empty() && (c.rfind(given, 0) == 0 || given.rfind(c, 0) == 0)) near = k;
  }
  return "launch: unknown option '" + name + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?") +
         " (hasten launch --help lists the options; the program comes after them)";
}

// Said once, when a run across machines starts without the run's secret.
void warn_without_token(const LaunchPlan& plan) {
  if (plan.num_machines == 1 || !plan.run_token.empty()) return;
  std::cerr << "hasten launch: " << detail::kRunTokenVariable
            << " is not set: this run's store and launcher agents accept whoever reaches their ports (set the same "
               "value on every machine, e.g. export HASTEN_RUN_TOKEN=$(openssl rand -hex 16); see docs/launch.md, "
               "\"Network and trust\")"
            << std::endl;
}

// --max_restarts with several machines: every machine's launcher follows the rounds machine
// 0's coordinator starts (machine_agents.hpp), so a failure anywhere restarts the workers
// everywhere.
int launch_across_machines(const LaunchPlan& plan, const Config& config, int min_machines) {
  if (plan.master_port <= 0 || plan.master_port >= 65535)
    throw ConfigError("config error: main_process_port " + std::to_string(plan.master_port) +
                      " cannot coordinate restarts across machines: give every machine the same port from 1 to "
                      "65534 (machine 0's launcher also listens on main_process_port + 1)");
  warn_without_token(plan);
  MachineAgents::Settings s;
  s.num_machines = plan.num_machines;
  s.machine_rank = plan.machine_rank;
  s.main_addr = plan.master_addr;
  s.agent_port = plan.master_port + 1;
  s.master_port = plan.master_port;
  s.max_restarts = config.max_restarts;
  s.min_machines = min_machines;
  s.join_timeout_s = config.rendezvous_timeout_s;
  s.token = plan.run_token;
  const Environment env = current_environment();  // a copy: find's iterator must outlive the call
  if (const auto bind = env.find("HASTEN_BIND_ADDR"); bind != env.end()) s.bind_override = bind->second;
  MachineAgents agents(s);
  for (;;) {
    const MachineAgents::Round round = agents.next_round();
    if (!round.run) {
      if (!round.why.empty()) std::cerr << "hasten launch: " << round.why << std::endl;
      return round.exit_code;
    }
    if (round.number > 0)
      std::cerr << "hasten launch: restart " << round.number << " of " << config.max_restarts
                << ": starting all workers again" << std::endl;
    LaunchPlan run = plan;
    run.master_port = round.master_port;
    // Elastic: this round's machines and this machine's place among them.
    run.num_machines = round.num_machines;
    run.machine_rank = round.machine_rank;
    run.world_size = round.num_machines * plan.local_world_size;
    if (min_machines > 0)
      std::cerr << "hasten launch: round " << round.number << " on " << round.num_machines << " machines (this one "
                << round.machine_rank << "), " << run.world_size << " processes" << std::endl;
    run.env.emplace_back("TORCHELASTIC_RESTART_COUNT", std::to_string(round.number));
    run.env.emplace_back("TORCHELASTIC_MAX_RESTARTS", std::to_string(config.max_restarts));
    bool said = false;
    run.stop_requested = [&] {
      if (!agents.stop_requested()) return false;
      if (!said) std::cerr << "hasten launch: " << agents.stop_reason() << "; stopping this machine's workers" << std::endl;
      said = true;
      return true;
    };
    run.on_failure = [&](int rank, const std::string& what) { agents.report_failure(rank, what); };
    bool interrupted = false;
    const int rc = run_workers(run, &interrupted);
    agents.report_end(rc, interrupted);
  }
}

// torchrun's elastic spelling, --num_machines MIN:MAX: the run takes MAX as num_machines (the
// processes per machine are num_processes / MAX) and returns MIN (0 for a plain count). The
// config keeps a plain count: Accelerate's files have no range.
int elastic_minimum(std::vector<std::pair<std::string, std::string>>& set) {
  int minimum = 0;
  for (auto& [key, value] : set) {
    if (key != "num_machines" || value.find(':') == std::string::npos) continue;
    const std::string lo = value.substr(0, value.find(':')), hi = value.substr(value.find(':') + 1);
    auto number = [](const std::string& t) {
      if (t.empty() || t.size() > 6 || t.find_first_not_of("0123456789") != std::string::npos) return -1;
      return std::stoi(t);
    };
    const int a = number(lo), b = number(hi);
    if (a < 1 || b < a)
      throw ConfigError("config error: num_machines '" + detail::printable(value, 40) +
                        "' is not a count or a range MIN:MAX (allowed: a whole number, or MIN:MAX with 1 <= MIN <= "
                        "MAX, torchrun's elastic --nnodes)");
    minimum = a == b ? 0 : a;
    value = hi;
  }
  return minimum;
}

int launch(const LaunchFlags& given) {
  LaunchFlags flags = given;
  const int min_machines = elastic_minimum(flags.set);
  if (flags.command.empty()) return report_error("launch: no PROGRAM given (usage: hasten launch [flags] PROGRAM [ARGS...])");
  if (flags.command[0].size() > 1 && flags.command[0][0] == '-')
    return report_error(unknown_flag_message(flags.command[0], flags.known_flags));
  if (!flags.dry_run && resolve_program(flags.command[0]).empty())
    return report_error("launch: cannot run '" + flags.command[0] + "': not found or not executable");
  Options options;
  options.origin = "flag";
  if (!flags.config_file.empty()) options.config_file = flags.config_file;
  options.set = flags.set;
  const Environment env = current_environment();
  // As the workers will resolve it, so that the dry run's plan and the plugin check below are theirs.
  Config config = resolve_as_workers(options, env);
  check_config_plugins(config);  // one error here, not the same one from every worker

  LaunchPlan plan;
  plan.command = flags.command;
  plan.world_size = config.num_processes;
  plan.num_machines = config.num_machines;
  plan.machine_rank = config.machine_rank;
  plan.local_world_size = config.num_processes / config.num_machines;
  plan.master_addr = config.main_process_ip;
  plan.master_port = config.main_process_port;
  plan.grace_s = flags.grace_s;
  // The run's secret: the store and the machine agents refuse whoever does not present it.
  // One machine: made here. Across machines every launcher must present the same one, so it
  // comes from the environment (the same HASTEN_RUN_TOKEN on every machine); without it the
  // run is open to whoever reaches its ports, as a torchrun run is.
  const auto given_token = env.find(detail::kRunTokenVariable);
  if (given_token != env.end() && !given_token->second.empty()) {
    detail::check_run_token(given_token->second);
    plan.run_token = given_token->second;
  } else if (config.num_machines == 1) {
    plan.run_token = detail::make_run_token();
  }
  if (config.num_machines == 1) {
    // One machine: port 0 or a busy port picks a free one.
    if (plan.master_port == 0 || !detail::port_is_free(plan.master_port)) {
      const int port = detail::pick_free_port(/*loopback_only=*/false);
      // Port 0 asks for a free port: nothing to say. A busy port is a surprise worth a line.
      if (plan.master_port != 0 && !flags.dry_run)
        std::cerr << "hasten launch: port " << plan.master_port << " is busy; using " << port << std::endl;
      plan.master_port = port;
    }
  }
  // Threads per worker: the flag or config, else what the environment says, else an even
  // share of the machine's cores.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = config.num_cpu_threads_per_process;
  if (threads == 0 && env.count("OMP_NUM_THREADS") == 0)
    threads = std::max(1, cores / std::max(1, plan.local_world_size));
  // The flag or config sets both; otherwise a variable the user set is kept, each on its own
  // (OPENBLAS_NUM_THREADS alone set is not overwritten by the share of cores).
  const bool asked = config.num_cpu_threads_per_process > 0;
  if (threads > 0) {
    if (asked || env.count("OMP_NUM_THREADS") == 0) plan.env.emplace_back("OMP_NUM_THREADS", std::to_string(threads));
    if (asked || env.count("OPENBLAS_NUM_THREADS") == 0)
      plan.env.emplace_back("OPENBLAS_NUM_THREADS", std::to_string(threads));
  }
  plan.env.emplace_back("HASTEN_CONFIG_JSON", config.explicit_json);
  // gpu_ids: the workers see only the listed GPUs (CUDA_VISIBLE_DEVICES, as accelerate launch
  // sets it; the ordinals count among what the launcher itself sees) and take them in
  // local-rank order, so they are handed gpu_ids "all".
  if (!config.use_cpu && config.gpu_ids != "all") {
    const std::vector<int> ids = parse_gpu_ids(config.gpu_ids);
    // One GPU per process: refused here, before any worker starts (and restarts).
    if (plan.local_world_size > static_cast<int>(ids.size()))
      throw ConfigError("gpu_ids '" + config.gpu_ids + "' lists " + std::to_string(ids.size()) + " GPU" +
                        (ids.size() == 1 ? "" : "s") + " for " + std::to_string(plan.local_world_size) +
                        " processes on this machine: two ranks would share a GPU (allowed: at most one process "
                        "per GPU; fewer processes, more gpu_ids, or --cpu)");
    std::vector<std::string> seen;
    const auto cvd = env.find("CUDA_VISIBLE_DEVICES");
    if (cvd != env.end()) {
      if (cvd->second.empty())
        throw ConfigError("gpu_ids '" + config.gpu_ids +
                          "': CUDA_VISIBLE_DEVICES is set and empty, so no GPU is visible (allowed: unset it, or "
                          "name the GPUs in it that gpu_ids counts among, or --cpu)");
      std::stringstream list(cvd->second);
      for (std::string item; std::getline(list, item, ',');) seen.push_back(item);
    }
    std::string visible;
    for (int id : ids) {
      if (!seen.empty() && id >= static_cast<int>(seen.size()))
        throw ConfigError("gpu_ids: GPU " + std::to_string(id) + " is not among the " + std::to_string(seen.size()) +
                          " of CUDA_VISIBLE_DEVICES='" + env.at("CUDA_VISIBLE_DEVICES") + "' (allowed: ordinals 0.." +
                          std::to_string(seen.size() - 1) + ")");
      visible += (visible.empty() ? "" : ",") + (seen.empty() ? std::to_string(id) : seen[static_cast<size_t>(id)]);
    }
    plan.env.emplace_back("CUDA_VISIBLE_DEVICES", visible);
    plan.env.emplace_back("HASTEN_GPU_IDS", "all");
  }
  // OpenBLAS reads OPENBLAS_CORETYPE when it loads: choose its kernel for the workers when it
  // would fall back to slow generic ones on this CPU (the environment's own value wins).
  if (env.count("OPENBLAS_CORETYPE") == 0) {
    const BlasAdvice advice = openblas_coretype_advice();
    if (!advice.coretype.empty()) {
      plan.env.emplace_back("OPENBLAS_CORETYPE", advice.coretype);
      if (!flags.dry_run)
        std::cerr << "hasten launch: " << advice.reason << "; workers get OPENBLAS_CORETYPE=" << advice.coretype
                  << " (set OPENBLAS_CORETYPE to choose another)" << std::endl;
    }
  }
  plan.prefix_output = plan.world_size > 1;
  if (config.tee || !config.log_dir.empty())
    plan.log_dir = config.log_dir.empty() ? std::string("hasten_logs/launch") : config.log_dir;

  if (min_machines > 0 && config.max_restarts < 1)
    throw ConfigError("config error: num_machines " + std::to_string(min_machines) + ":" +
                      std::to_string(config.num_machines) +
                      " (elastic) needs max_restarts above 0: a machine that leaves or joins restarts the workers, and "
                      "each such restart counts");
  // Each machine's copy of a checkpoint is tied to the machines that wrote it (check_machine_copy):
  // a round on other machines could not load it.
  if (min_machines > 0 && config.save_on_each_node)
    throw ConfigError("config error: num_machines " + std::to_string(min_machines) + ":" +
                      std::to_string(config.num_machines) +
                      " (elastic) with save_on_each_node: each machine's checkpoint copy loads only on the machines "
                      "that wrote it; give the machines a shared file system (save_on_each_node: false)");
  if (flags.dry_run) {
    std::cout << "hasten launch plan (dry run: nothing is started)\n"
              << "machine " << plan.machine_rank << " of " << plan.num_machines << ", "
              << plan.local_world_size << " local workers of " << plan.world_size << ", rendezvous "
              << plan.master_addr << ":" << plan.master_port << "\n"
              << "resolved config:\n"
              << nlohmann::json::parse(config.resolved_json).dump(2) << "\n";
    for (int lr = 0; lr < plan.local_world_size; ++lr) {
      std::cout << "worker rank " << plan.global_rank(lr) << " (local rank " << lr << "):";
      for (auto& [k, v] : plan.worker_env(lr))
        std::cout << " " << k << "=" << (k == detail::kRunTokenVariable ? std::string("(secret)") : shell_quote(v));
      for (auto& a : plan.command) std::cout << " " << shell_quote(a);
      std::cout << "\n";
    }
    if (!plan.log_dir.empty()) std::cout << "per-rank logs: " << plan.log_dir << "/rank_<r>.log\n";
    return 0;
  }
  if (config.max_restarts > 0 && config.num_machines > 1) return launch_across_machines(plan, config, min_machines);
  warn_without_token(plan);
  // torchrun's --max_restarts: a failed worker stops the others and all start again, up to
  // max_restarts times; the workers learn the attempt from TORCHELASTIC_RESTART_COUNT (a
  // program resumes from its newest checkpoint: hasten-example --resume, load_state()).
  for (int attempt = 0;; ++attempt) {
    LaunchPlan run = plan;
    run.env.emplace_back("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt));
    run.env.emplace_back("TORCHELASTIC_MAX_RESTARTS", std::to_string(config.max_restarts));
    bool interrupted = false;
    const int rc = run_workers(run, &interrupted);
    if (rc == 0 || interrupted || attempt >= config.max_restarts) {
      if (rc != 0 && config.max_restarts > 0 && !interrupted)
        std::cerr << "hasten launch: giving up after " << config.max_restarts << " restart"
                  << (config.max_restarts == 1 ? "" : "s") << std::endl;
      return rc;
    }
    std::cerr << "hasten launch: restart " << attempt + 1 << " of " << config.max_restarts
              << ": starting all workers again" << std::endl;
    if (config.num_machines == 1 && !detail::port_is_free(plan.master_port))
      plan.master_port = detail::pick_free_port(/*loopback_only=*/false);  // the old store may linger
  }
}

// The config schema's keys by name (config_keys()). Without the plugins' keys (a registry
// that cannot be read) the core flags still parse; their help is then the key they set.
std::map<std::string, ConfigKeyInfo> key_rows() {
  std::map<std::string, ConfigKeyInfo> rows;
  try {
    for (auto& k : config_keys()) rows[k.key] = k;
  } catch (const std::exception&) {
  }
  return rows;
}

}  // namespace

void add_launch_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "launch", "Start this machine's workers of a training program: hasten launch [flags] PROGRAM [ARGS...]");
  auto flags = std::make_shared<LaunchFlags>();
  cmd->prefix_command();  // everything from PROGRAM on belongs to the program
  cmd->add_option("--config_file,--config-file", flags->config_file, "Config file (YAML, Accelerate keys accepted)");
  // Flags that set a config key of the same name (Accelerate's launcher flags are its config
  // keys' names). Each flag's help is its key's description in the schema (`hasten config
  // keys`), so the two never say different things.
  const std::map<std::string, ConfigKeyInfo> rows = key_rows();
  std::set<std::string> taken = {"config_file"};
  auto key_flag = [&](const std::string& flag, const std::string& key) {
    std::string help = "Sets " + key;
    if (auto it = rows.find(key); it != rows.end()) {
      help = (key.find('.') == std::string::npos ? "" : key + ": ") + it->second.doc;
      if (!it->second.allowed.empty()) help += " (allowed: " + it->second.allowed + ")";
    }
    std::string names = "--" + flag;
    if (flag.find('_') != std::string::npos) {
      std::string dashed = flag;
      std::replace(dashed.begin(), dashed.end(), '_', '-');
      names += ",--" + dashed;
    }
    cmd->add_option_function<std::string>(
           names, [flags, key](const std::string& v) { flags->set.emplace_back(key, v); }, help)
        ->type_name("VALUE");
    taken.insert(flag);
  };
  for (const char* key : {"num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port",
                          "max_restarts", "num_cpu_threads_per_process", "mixed_precision", "gpu_ids",
                          "gradient_accumulation_steps", "strategy", "precision", "log_dir", "rdzv_backend"})
    key_flag(key, key);
  // The installed strategies' section keys, under their own names as Accelerate's launcher
  // takes them (--zero_stage, --offload_optimizer_device, --fsdp_sharding_strategy, ...): they
  // take effect when that strategy runs (--use_deepspeed, --use_fsdp or the config select it).
  // A key two sections share, or one named like a flag above, keeps the first meaning.
  for (const auto& [path, row] : rows) {
    const auto dot = path.find('.');
    if (dot == std::string::npos) continue;
    const std::string leaf = path.substr(dot + 1);
    if (!taken.count(leaf)) key_flag(leaf, path);
  }
  add_set_option(
      *cmd, [flags](std::string key, std::string value) { flags->set.emplace_back(std::move(key), std::move(value)); },
      "Any config key, KEY=VALUE with a YAML value (repeatable): --set strategy_options='{stage: 3}'")
      ->allow_extra_args(false);  // one value per --set: what follows may be the program
  // Accelerate's paradigm flags: each sets distributed_type, so the strategy that answers to
  // it runs (an explicit --strategy still wins, as in the config). They exclude each other, as
  // in Accelerate; --cpu sets use_cpu and excludes --multi_gpu.
  struct ParadigmFlag {
    const char* names;
    const char* distributed_type;
    const char* help;
  };
  static const ParadigmFlag paradigm_flags[] = {
      {"--multi_gpu,--multi-gpu", "MULTI_GPU", "Data parallel across processes (distributed_type MULTI_GPU)"},
      {"--use_deepspeed,--use-deepspeed", "DEEPSPEED", "ZeRO (distributed_type DEEPSPEED)"},
      {"--use_fsdp,--use-fsdp", "FSDP", "Fully sharded data parallel (distributed_type FSDP)"},
  };
  std::vector<CLI::Option*> paradigms;
  for (const auto& f : paradigm_flags)
    paradigms.push_back(cmd->add_flag_function(
        f.names, [flags, type = std::string(f.distributed_type)](int64_t) { flags->set.emplace_back("distributed_type", type); },
        f.help));
  for (auto* a : paradigms)
    for (auto* b : paradigms)
      if (a != b) a->excludes(b);
  cmd->add_flag_function("--cpu", [flags](int64_t) { flags->set.emplace_back("use_cpu", "true"); },
                         "Train on the CPU (use_cpu: true)")
      ->excludes(paradigms[0]);
  // torchrun's (and so Accelerate's) --tee takes which streams to copy into the log files: 0
  // none, 1 stdout, 2 stderr, 3 both. hasten's log files hold both streams of every rank.
  cmd->add_option_function<std::string>(
         "--tee",
         [flags](const std::string& v) {
           if (v != "0" && v != "3")
             throw CLI::ValidationError("--tee", "value '" + v +
                                                     "' is not allowed (allowed: 0, no log files, or 3, both "
                                                     "streams of every rank; hasten writes no one-stream logs)");
           flags->set.emplace_back("tee", v == "3" ? "true" : "false");
         },
         "Copy each rank's output into LOG_DIR/rank_<r>.log (default hasten_logs/launch): 3 (stdout and stderr) "
         "or 0 (none), torchrun's values")
      ->type_name("0|3");
  // Accelerate's --dynamo_backend: TorchDynamo compiles Python; hasten runs LibTorch modules as
  // they are. "no" (Accelerate's default) is accepted, a backend refused by the config check.
  cmd->add_option_function<std::string>(
         "--dynamo_backend,--dynamo-backend",
         [flags](const std::string& v) { flags->set.emplace_back("dynamo_config", "{dynamo_backend: '" + v + "'}"); },
         "Only no: torch.compile (TorchDynamo) compiles Python, and hasten runs LibTorch's C++ modules as they are")
      ->type_name("no");
  cmd->add_flag_function("--debug", [flags](int64_t) { flags->set.emplace_back("debug", "true"); },
                         "Check collectives across ranks");
  cmd->add_flag("--dry-run,--dry_run", flags->dry_run, "Print the plan and start nothing");
  cmd->add_option("--grace_period,--grace-period", flags->grace_s,
                  "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(hasten::cli::finite_in(0.001, 86400));
  cmd->callback([&action, flags, cmd] {
    for (auto* opt : cmd->get_options())
      for (auto& long_name : opt->get_lnames()) flags->known_flags.push_back("--" + long_name);
    for (auto& extra : cmd->remaining()) flags->command.push_back(extra);
    action = [flags] { return launch(*flags); };
  });
}

}  // namespace hasten::cli
