// `hasten estimate-memory (--params N | --workload W) [--num_processes N]`: the bytes one rank
// holds between optimizer steps for parameters, gradients and optimizer state (Adam/AdamW), per
// strategy and parameter dtype, computed from the layout hasten's strategies use (the same
// quantities Accelerator::memory_report() gives, so the estimate can be checked against a run:
// tests/integration/test_estimate_memory.py).
#include <hasten/config.hpp>
#include <hasten/error.hpp>
#include <hasten/unit.hpp>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "../cli_checks.hpp"
#include "commands.hpp"
#include "workloads.hpp"

namespace hasten::cli {

namespace {

struct EstimateFlags {
  std::string params;
  std::string workload;
  bool units = false;
  int num_processes = 0;  // 0: the config's
  std::string config_file;
  std::vector<std::string> dtypes = {"fp32", "bf16", "fp16"};
  bool json = false;
};

// Bytes of one rank, the fields of hasten::MemoryReport.
struct Row {
  std::string strategy, dtype;
  uint64_t params = 0, param_shards = 0, grads = 0, optimizer = 0;
  uint64_t total() const { return params + param_shards + grads + optimizer; }
};

constexpr double kMaxParams = 1e15;  // beyond any model; above it the byte counts overflow

// "7e9", "7000000000", "7B", "1.3b", "350M", "125k": a parameter count.
uint64_t parse_params(const std::string& text) {
  const std::string allowed = "a positive count such as 7e9, 7B, 350M or 125000, at most 1e15";
  double scale = 1;
  std::string number = text;
  if (!number.empty()) {
    switch (number.back()) {
      case 'k': case 'K': scale = 1e3; break;
      case 'm': case 'M': scale = 1e6; break;
      case 'b': case 'B': case 'g': case 'G': scale = 1e9; break;
      case 't': case 'T': scale = 1e12; break;
      default: break;
    }
    if (scale != 1) number.pop_back();
  }
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(number.c_str(), &end);
  const double count = std::round(v * scale);
  if (number.empty() || end == nullptr || *end != '\0' || errno != 0 || !std::isfinite(v) || count < 1 ||
      count > kMaxParams)
    throw ConfigError("estimate-memory: --params '" + text + "' is not allowed (allowed: " + allowed + ")");
  return static_cast<uint64_t>(count);
}

// Trainable parameters of each unit of a workload's model, as a sharding strategy sees them:
// the model itself first (what no nested unit owns), then every hasten::Unit.
std::vector<uint64_t> workload_units(const std::string& name, bool units) {
  torch::NoGradGuard no_grad;
  auto model = hasten::workloads::build_model(name, units);
  std::vector<uint64_t> sizes{0};
  struct Walk {
    std::vector<uint64_t>& sizes;
    void operator()(const torch::nn::Module& m, size_t unit) {
      if (dynamic_cast<const UnitBase*>(&m) != nullptr) {
        unit = sizes.size();
        sizes.push_back(0);
      }
      for (auto& p : m.named_parameters(/*recurse=*/false))
        if (p.value().requires_grad()) sizes[unit] += static_cast<uint64_t>(p.value().numel());
      for (auto& child : m.children()) (*this)(*child, unit);
    }
  } walk{sizes};
  walk(*model, 0);
  std::vector<uint64_t> nonempty;
  for (auto s : sizes)
    if (s > 0) nonempty.push_back(s);
  return nonempty;
}

// The layout of hasten's strategies (docs/cli.md, "hasten estimate-memory", states it).
std::vector<Row> estimate(const std::vector<uint64_t>& units, uint64_t world, const std::vector<std::string>& dtypes) {
  uint64_t count = 0, padded = 0, shard = 0;
  for (uint64_t u : units) {
    const uint64_t p = (u + world - 1) / world * world;  // each unit's flat buffer, padded to W
    count += u, padded += p, shard += p / world;
  }
  std::vector<Row> rows;
  for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3", "fsdp"})
    for (const auto& dtype : dtypes) {
      const uint64_t b = dtype == "fp32" ? 4 : 2;
      Row r;
      r.strategy = strategy;
      r.dtype = dtype;
      if (strategy == "ddp") {
        r.params = b * count;
        r.grads = b * count;
        r.optimizer = 8 * count;                     // Adam's two moments, fp32
        r.param_shards = b == 4 ? 0 : 4 * count;     // 16-bit: an fp32 master copy
      } else {
        const int stage = strategy == "zero1" ? 1 : strategy == "zero2" ? 2 : 3;
        r.params = stage < 3 ? b * padded : 0;       // stage 3 gathers units only while they run
        r.grads = stage == 1 ? b * padded : 4 * shard;  // sharded gradients are fp32, as the masters
        r.param_shards = 4 * shard;                  // the fp32 master shard the optimizer steps
        r.optimizer = 8 * shard;
      }
      rows.push_back(r);
    }
  return rows;
}

std::string human(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int k = 0;
  while (v >= 1024 && k < 5) v /= 1024, ++k;
  char buf[32];
  if (k == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[k]);
  return buf;
}

int run_estimate(const EstimateFlags& flags) {
  if (flags.params.empty() == flags.workload.empty())
    return report_error("estimate-memory: give exactly one of --params N and --workload NAME (allowed workloads: mlp-small, mlp-large, gpt-tiny)");
  if (flags.units && flags.workload.empty())
    return report_error("estimate-memory: --units applies to --workload only (--params counts one unit)");
  int world = flags.num_processes;
  if (world == 0) {
    Options options;
    options.origin = "flag";
    if (!flags.config_file.empty()) options.config_file = flags.config_file;
    world = resolve_config(options).num_processes;
  }
  std::vector<uint64_t> units;
  std::string what;
  if (!flags.params.empty()) {
    units = {parse_params(flags.params)};
    what = std::to_string(units[0]) + " parameters (one unit)";
  } else {
    units = workload_units(flags.workload, flags.units);
    uint64_t n = 0;
    for (auto u : units) n += u;
    what = "workload " + flags.workload + ": " + std::to_string(n) + " parameters in " + std::to_string(units.size()) +
           " unit" + (units.size() == 1 ? "" : "s") + (flags.units ? " (--units, as hasten-example --units)" : "");
  }
  const auto rows = estimate(units, static_cast<uint64_t>(world), flags.dtypes);
  if (flags.json) {
    nlohmann::ordered_json out;
    uint64_t n = 0;
    for (auto u : units) n += u;
    out["parameters"] = n;
    out["units"] = units;
    out["num_processes"] = world;
    out["rows"] = nlohmann::ordered_json::array();
    for (auto& r : rows)
      out["rows"].push_back({{"strategy", r.strategy}, {"dtype", r.dtype}, {"params", r.params},
                             {"param_shards", r.param_shards}, {"grads", r.grads}, {"optimizer", r.optimizer},
                             {"total", r.total()}});
    std::cout << out.dump() << std::endl;
    return 0;
  }
  std::cout << "hasten estimate-memory: " << what << ", " << world << " process" << (world == 1 ? "" : "es")
            << ", Adam/AdamW\nbytes one rank holds between optimizer steps (rank 0, the largest share):\n\n";
  const int w = 12;
  std::cout << std::left << std::setw(10) << "strategy" << std::setw(7) << "dtype" << std::right << std::setw(w)
            << "params" << std::setw(w + 2) << "param shards" << std::setw(w) << "grads" << std::setw(w)
            << "optimizer" << std::setw(w) << "total" << "\n";
  for (auto& r : rows)
    std::cout << std::left << std::setw(10) << r.strategy << std::setw(7) << r.dtype << std::right << std::setw(w)
              << human(r.params) << std::setw(w + 2) << human(r.param_shards) << std::setw(w) << human(r.grads)
              << std::setw(w) << human(r.optimizer) << std::setw(w) << human(r.total()) << "\n";
  std::cout << "\nAssumptions: Adam/AdamW (two fp32 moments per parameter, 8 bytes); params: full parameters in\n"
               "the dtype; param shards: fp32 master copies (16-bit ddp: a full fp32 copy, as Accelerate's and\n"
               "DeepSpeed's mixed precision keep; zero/fsdp: the 1/W shard the optimizer steps, kept in fp32 for\n"
               "every dtype); zero1 keeps full gradients, zero2/zero3/fsdp an fp32 gradient shard; zero3 and\n"
               "fsdp (FULL_SHARD) hold no full parameters between steps. Each unit's flat buffer is padded to a\n"
               "multiple of W. Not counted: activations, the units stage 3 gathers while they run, communication\n"
               "buffers, LibTorch's own allocations. hasten's mixed_precision bf16/fp16 keeps fp32 parameters\n"
               "(autocast): its run is the fp32 row; the 16-bit rows are for a model converted before prepare.\n";
  return 0;
}

}  // namespace

void add_estimate_memory_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "estimate-memory",
      "Per-rank bytes of parameters, gradients and optimizer state per strategy and dtype, for a parameter "
      "count or a built-in workload");
  auto flags = std::make_shared<EstimateFlags>();
  cmd->add_option("--params", flags->params, "Parameter count: 7e9, 7B, 350M, 125000");
  cmd->add_option("--workload", flags->workload, "A built-in workload (docs/workloads.md)")
      ->check(CLI::IsMember(hasten::workloads::names()));
  cmd->add_flag("--units", flags->units, "The workload with every layer a unit (as hasten-example --units)");
  cmd->add_option("--num_processes,--num-processes", flags->num_processes,
                  "Processes sharing the run (default: the config's num_processes)")
      ->check(integer_in(1, 1 << 20));
  cmd->add_option("--config_file,--config-file", flags->config_file, "Config file for the default num_processes");
  cmd->add_option("--dtypes", flags->dtypes, "Parameter dtypes to show (default: fp32 bf16 fp16)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->delimiter(',');
  cmd->add_flag("--json", flags->json, "One JSON object with every row, in bytes");
  cmd->callback([&action, flags] { action = [flags] { return run_estimate(*flags); }; });
}

}  // namespace hasten::cli
