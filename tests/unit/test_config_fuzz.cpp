// Fuzz-style: generated config documents (random YAML structures, scalar types, depths,
// anchors and aliases, some malformed) go through resolve_config as a file, as --set values,
// as HASTEN_<KEY> variables and as HASTEN_CONFIG_JSON. Each must end in a Config or one
// hasten::Error of one line; anything else thrown fails here, and a crash fails the process.
#include <hasten/config.hpp>
#include <hasten/error.hpp>

#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "fuzz_budget.hpp"
#include "test_util.hpp"

namespace {

// Keys hasten knows (so that documents reach value checks), Accelerate sections, and others.
const std::vector<std::string> kKeys = {
    "mixed_precision", "num_processes", "num_machines", "machine_rank", "distributed_type", "trackers",
    "strategy", "strategy_options", "precision_options", "tracker_options", "comm", "timeout_s",
    "fsdp_config", "deepspeed_config", "zero_stage", "fsdp_sharding_strategy", "gradient_accumulation_steps",
    "main_process_port", "use_cpu", "resume", "tpu_env", "commands", "dynamo_config", "unknown_key", "a", "b"};
// Scalars of every type, edge values, and text that breaks YAML.
const std::vector<std::string> kScalars = {
    "1", "0", "-5", "4", "65536", "99999999999999999999", "1e300", "-1e300", "nan", ".nan", ".inf", "2.5", "true",
    "no", "'NO'", "NO", "MULTI_CPU", "FSDP", "DEEPSPEED", "bf16", "fp16", "fp8", "csv", "jsonl", "ddp", "single",
    "zero", "FULL_SHARD", "auto", "~", "null", "''", "\"\"", "'quoted: text'", "\"a\\tb\"", "[csv", "{", "}", ":",
    "- x", "&", "*", "*nowhere", "!!binary aGk=", "!!int x", "\"\\x00\"", "'unterminated", "0x10", "1_000",
    "\xff\xfe", "\xc3", "a,b,,c"};

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}

  int below(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }
  const std::string& pick(const std::vector<std::string>& v) { return v[static_cast<size_t>(below(static_cast<int>(v.size())))]; }

  // A node in YAML's flow style, nested up to `depth` more levels.
  std::string flow(int depth) {
    std::string anchor;
    if (below(8) == 0) {
      anchor = "a" + std::to_string(anchors_++);
      open_.push_back(anchor);
    }
    std::string out = anchor.empty() ? "" : "&" + anchor + " ";
    const int choice = depth <= 0 ? 0 : below(10);
    if (choice < 4) {
      out += pick(kScalars);
    } else if (choice < 6 && !open_.empty()) {
      out = (anchor.empty() ? "" : out) + "*" + open_[static_cast<size_t>(below(static_cast<int>(open_.size())))];
    } else if (choice < 8) {
      out += "[";
      for (int i = 0, n = below(4); i < n; ++i) out += (i ? ", " : "") + flow(depth - 1);
      out += "]";
    } else {
      out += "{";
      for (int i = 0, n = below(4); i < n; ++i) out += (i ? ", " : "") + pick(kKeys) + ": " + flow(depth - 1);
      out += "}";
    }
    return out;
  }

  // A block mapping of top-level keys; sometimes a list, a scalar or nothing.
  std::string document() {
    anchors_ = 0;
    open_.clear();
    const int shape = below(20);
    if (shape == 0) return "";
    if (shape == 1) return flow(depth()) + "\n";
    if (shape == 2) {  // plain nesting around the limit of 64 (random trees rarely reach it)
      const int n = 55 + below(20);
      return pick(kKeys) + ": " + std::string(static_cast<size_t>(n), '[') + pick(kScalars) +
             std::string(static_cast<size_t>(n), ']') + "\n";
    }
    std::string doc;
    for (int i = 0, n = 1 + below(5); i < n; ++i) {
      doc += pick(kKeys) + ":";
      if (below(4) == 0) {  // a block section
        doc += "\n";
        for (int k = 0, m = 1 + below(3); k < m; ++k) doc += "  " + pick(kKeys) + ": " + flow(depth()) + "\n";
      } else {
        doc += " " + flow(depth()) + "\n";
      }
    }
    return doc;
  }

  // JSON text, nested up to `depth`, with now and then a fault.
  std::string json(int depth) {
    if (depth > 50 && below(4) == 0) {  // plain nesting around the limit
      const int n = 55 + below(20);
      return std::string(static_cast<size_t>(n), '[') + std::string(static_cast<size_t>(n), ']');
    }
    const int choice = depth <= 0 ? 0 : below(6);
    if (choice < 2) {
      static const std::vector<std::string> scalars = {"1", "-1", "2.5", "1e999", "true", "null", "\"NO\"", "\"csv\"", "\"\"", "\"\\u0000\""};
      return pick(scalars);
    }
    if (choice < 4) {
      std::string out = "[";
      for (int i = 0, n = below(4); i < n; ++i) out += (i ? "," : "") + json(depth - 1);
      return out + "]";
    }
    std::string out = "{";
    for (int i = 0, n = below(4); i < n; ++i) out += (i ? "," : "") + ("\"" + pick(kKeys) + "\":") + json(depth - 1);
    return out + "}";
  }

  // Mostly shallow, sometimes past the limit of 64.
  int depth() { return below(10) == 0 ? 60 + below(20) : below(5); }

 private:
  std::mt19937_64 rng_;
  int anchors_ = 0;
  std::vector<std::string> open_;
};

std::string env_name_of(const std::string& key) {
  std::string out = "HASTEN_";
  for (char c : key) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

TEST(ConfigFuzz, GeneratedDocumentsEndInAConfigOrOneError) {
  hasten::test::FuzzBudget budget(20261203, 3000);
  Generator gen(budget.seed());
  hasten::test::TempDir dir;
  int accepted = 0, refused = 0, i = 0;
  for (; budget.more(i); ++i) {
    hasten::Environment env = {{"HASTEN_HOME", dir.path().string()}};
    hasten::Options o;
    std::string what;
    switch (i % 4) {
      case 0:
        what = gen.document();
        o.config_file = dir.write("fuzz.yaml", what);
        break;
      case 1:
        what = gen.flow(gen.depth());
        o.set = {{gen.pick(kKeys), what}};
        o.origin = gen.below(2) ? "flag" : "code";
        break;
      case 2:
        what = gen.flow(gen.depth());
        env[env_name_of(gen.pick(kKeys))] = what;
        break;
      case 3:
        what = gen.below(10) == 0 ? gen.json(gen.depth()).substr(0, static_cast<size_t>(gen.below(40))) : gen.json(gen.depth());
        env["HASTEN_CONFIG_JSON"] = what;
        break;
    }
    try {
      hasten::resolve_config(o, env);
      ++accepted;
    } catch (const hasten::Error& e) {
      ++refused;
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("config error: ", 0), 0u) << "case " << i << " (seed " << budget.seed() << "): " << message
                                                        << "\ninput: " << what;
      EXPECT_EQ(message.find('\n'), std::string::npos) << "case " << i << ": " << message << "\ninput: " << what;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << i << " (seed " << budget.seed() << ") threw a non-hasten error: " << e.what()
                    << "\ninput: " << what;
    }
    if (HasFailure()) break;  // the first failure with its input, not thousands
  }
  // Both outcomes occur: the generator reaches past the parsers into the checks.
  EXPECT_GT(accepted, i / 20) << accepted << " accepted of " << i;
  EXPECT_GT(refused, i / 20) << refused << " refused of " << i;
  std::printf("config fuzz: seed %llu, %d documents, %d accepted, %d refused\n",
              static_cast<unsigned long long>(budget.seed()), i, accepted, refused);
}
