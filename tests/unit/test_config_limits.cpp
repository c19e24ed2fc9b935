// Configuration under hostile or contradictory input: every source is bounded in depth and
// size, repeated keys and contradictory keys are errors naming the source, and list values
// from the environment parse as YAML or fail.
#include <hasten/config.hpp>
#include <hasten/error.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "test_util.hpp"

// Named, so that a unity build of this file with others has no clashing helper names.
namespace config_limits_tests {

namespace fs = std::filesystem;
using hasten::ConfigError;
using hasten::Environment;
using hasten::Options;

namespace {

Environment clean_env(const fs::path& home) { return {{"HASTEN_HOME", home.string()}}; }

std::string error_of(const Options& o, const Environment& env) {
  try {
    hasten::resolve_config(o, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

}  // namespace

// `a: &a [*a]` is a list that holds itself: converting it recursed until the stack overflowed.
TEST(ConfigLimits, ARecursiveAliasIsAnErrorInEverySource) {
  hasten::test::TempDir dir;
  Options from_file;
  from_file.config_file = dir.write("c.yaml", "a: &a [*a]\n");
  const std::string file_error = error_of(from_file, clean_env(dir.path()));
  EXPECT_HAS(file_error, "config error: file '" + *from_file.config_file + "': nests deeper than 64 levels");

  Options from_set;
  from_set.set = {{"strategy_options", "&a {x: *a}"}};
  const std::string set_error = error_of(from_set, clean_env(dir.path()));
  EXPECT_HAS(set_error, "code options (strategy_options): nests deeper than 64 levels");

  Options from_flag;
  from_flag.origin = "flag";
  from_flag.set = {{"trackers", "&a [*a]"}};
  EXPECT_HAS(error_of(from_flag, clean_env(dir.path())), "command-line flags (trackers): nests deeper than 64 levels");

  Environment env = clean_env(dir.path());
  env["HASTEN_STRATEGY_OPTIONS"] = "&a {x: *a}";
  EXPECT_HAS(error_of({}, env), "environment HASTEN_STRATEGY_OPTIONS: nests deeper than 64 levels");
  env.erase("HASTEN_STRATEGY_OPTIONS");
  env["HASTEN_COMM"] = "{cpu: &a [*a]}";
  EXPECT_HAS(error_of({}, env), "nests deeper than 64 levels");
}

// Nine levels of nine aliases expand 200 bytes into 9^9 values ("billion laughs").
TEST(ConfigLimits, AliasExpansionIsBounded) {
  hasten::test::TempDir dir;
  std::string yaml = "l0: &l0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 10; ++i) {
    yaml += "l" + std::to_string(i) + ": &l" + std::to_string(i) + " [";
    for (int k = 0; k < 9; ++k) yaml += std::string(k ? ", " : "") + "*l" + std::to_string(i - 1);
    yaml += "]\n";
  }
  Options o;
  o.config_file = dir.write("laughs.yaml", yaml);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_HAS(error_of(o, clean_env(dir.path())), "holds more than 100000 values once aliases are expanded");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(ConfigLimits, DeeplyNestedLauncherJsonIsAnError) {
  hasten::test::TempDir dir;
  Environment env = clean_env(dir.path());
  env["HASTEN_CONFIG_JSON"] = "{\"strategy_options\": " + std::string(65000, '[') + std::string(65000, ']') + "}";
  EXPECT_HAS(error_of({}, env), "config error: environment HASTEN_CONFIG_JSON: nests deeper than 64 levels");
  env["HASTEN_CONFIG_JSON"] = [] {
    std::string s = "{\"commands\": [0";
    for (int i = 0; i < 100001; ++i) s += ",0";
    return s + "]}";
  }();
  EXPECT_HAS(error_of({}, env), "environment HASTEN_CONFIG_JSON: holds more than 100000 values");
  // Deep YAML is refused by the YAML parser itself, as one error.
  Options o;
  o.config_file = dir.write("deep.yaml", "a: " + std::string(100000, '[') + std::string(100000, ']') + "\n");
  EXPECT_HAS(error_of(o, clean_env(dir.path())), "config error: file '" + *o.config_file + "':");
}

TEST(ConfigLimits, ARepeatedKeyIsAnErrorNamingTheKeyAndTheSource) {
  hasten::test::TempDir dir;
  Options o;
  o.config_file = dir.write("c.yaml", "mixed_precision: bf16\nfsdp_config:\n  a: 1\n  a: 2\nmixed_precision: 'no'\n");
  EXPECT_HAS(error_of(o, clean_env(dir.path())),
             "config error: file '" + *o.config_file + "': the key 'fsdp_config.a' appears twice in one mapping");
  o.config_file = dir.write("d.yaml", "mixed_precision: bf16\nmixed_precision: 'no'\n");
  EXPECT_HAS(error_of(o, clean_env(dir.path())), "the key 'mixed_precision' appears twice");
  Options s;
  s.set = {{"strategy_options", "{k: 1, k: 2}"}};
  EXPECT_HAS(error_of(s, clean_env(dir.path())), "code options (strategy_options): the key 'k' appears twice");
}

TEST(ConfigLimits, AListFromTheEnvironmentThatOpensABracketMustBeYaml) {
  hasten::test::TempDir dir;
  Environment env = clean_env(dir.path());
  env["HASTEN_TRACKERS"] = "[csv";
  EXPECT_HAS(error_of({}, env), "config error: environment HASTEN_TRACKERS: malformed YAML value '[csv'");
  env["HASTEN_TRACKERS"] = "[csv, jsonl]";
  EXPECT_EQ(hasten::resolve_config({}, env).trackers, (std::vector<std::string>{"csv", "jsonl"}));
  env["HASTEN_TRACKERS"] = "[csv, [x]]";
  EXPECT_HAS(error_of({}, env), "trackers: expected a list of strings, got item '[\"x\"]'");
  env["HASTEN_TRACKERS"] = "csv, jsonl";  // the comma form stays
  EXPECT_EQ(hasten::resolve_config({}, env).trackers, (std::vector<std::string>{"csv", "jsonl"}));
}

// Accelerate's NO is one process; the launcher would start four that the dry run calls single.
TEST(ConfigLimits, DistributedTypeNoWithSeveralProcessesIsAnError) {
  hasten::test::TempDir dir;
  Options o;
  o.config_file = dir.write("c.yaml", "distributed_type: 'NO'\nnum_processes: 4\n");
  const std::string e = error_of(o, clean_env(dir.path()));
  EXPECT_HAS(e, "distributed_type NO (file " + *o.config_file + ") runs one process but num_processes is 4 (file " +
                    *o.config_file + ")");
  o.config_file = dir.write("m.yaml", "distributed_type: MULTI_CPU\nnum_processes: 4\n");
  EXPECT_EQ(hasten::resolve_config(o, clean_env(dir.path())).strategy, "ddp");
  o.config_file = dir.write("s.yaml", "distributed_type: 'NO'\nnum_processes: 4\nstrategy: ddp\n");
  EXPECT_EQ(hasten::resolve_config(o, clean_env(dir.path())).strategy, "ddp");
  o.config_file = dir.write("n.yaml", "num_processes: 4\n");
  EXPECT_NO_THROW(hasten::resolve_config(o, clean_env(dir.path())));
}

TEST(ConfigLimits, TimeoutHasAnUpperBound) {
  hasten::test::TempDir dir;
  Environment env = clean_env(dir.path());
  env["HASTEN_TIMEOUT_S"] = "1e300";
  EXPECT_HAS(error_of({}, env), "timeout_s: 1e300 is out of range (allowed: 0.001 to 31536000)");
  env["HASTEN_TIMEOUT_S"] = "31536000";
  EXPECT_EQ(hasten::resolve_config({}, env).timeout_s, 31536000.0);
}

}  // namespace config_limits_tests
