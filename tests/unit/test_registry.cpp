// The plugin registry: discovery, selection, and every refusal, each proven with a
// deliberately broken plugin (tests/plugins/).
#include <hasten/error.hpp>
#include <hasten/plugin.hpp>
#include <hasten/registry.hpp>

#include <gtest/gtest.h>

#include <algorithm>

#include "test_util.hpp"

using hasten::PluginKind;
using hasten::PluginRegistry;
using hasten::test::test_plugin;

namespace {

std::string refusal_of(const std::string& dir, const std::string& file) {
  auto result = PluginRegistry::instance().inspect(test_plugin(dir, file));
  EXPECT_FALSE(result.valid) << file;
  std::string all;
  for (auto& r : result.refusals) all += (r.plugin.empty() ? "" : "[" + r.plugin + "] ") + r.reason + "\n";
  return all;
}

bool has(const std::vector<hasten::PluginInfo>& plugins, PluginKind kind, const std::string& name) {
  return std::any_of(plugins.begin(), plugins.end(),
                     [&](auto& p) { return p.kind == kind && p.name == name; });
}

}  // namespace

TEST(Registry, DiscoversTheFirstPartyPlugins) {
  auto plugins = PluginRegistry::instance().plugins();
  EXPECT_TRUE(has(plugins, PluginKind::Strategy, "single"));
  EXPECT_TRUE(has(plugins, PluginKind::Precision, "no"));
  EXPECT_TRUE(has(plugins, PluginKind::Precision, "bf16"));
  EXPECT_TRUE(has(plugins, PluginKind::Precision, "fp16"));
  EXPECT_TRUE(has(plugins, PluginKind::Tracker, "csv"));
  EXPECT_TRUE(has(plugins, PluginKind::Tracker, "jsonl"));
  for (auto& p : plugins) {
    EXPECT_EQ(p.abi_major, 1u);
    if (p.kind == PluginKind::Strategy || p.kind == PluginKind::Precision) {
      EXPECT_EQ(p.tier, "torch");
    }
    if (p.kind == PluginKind::Tracker) {
      EXPECT_EQ(p.tier, "c");
    }
  }
  // No first-party library is refused.
  const std::string first_party_dir = PluginRegistry::instance().search_path().front();
  for (auto& r : PluginRegistry::instance().refusals())
    EXPECT_NE(r.file.rfind(first_party_dir, 0), 0u) << r.file << ": " << r.reason;
}

TEST(Registry, SelectsByNameAndListsWhatIsAvailable) {
  auto sel = PluginRegistry::instance().select(PluginKind::Strategy, "single");
  EXPECT_EQ(sel.info->name, "single");
  try {
    PluginRegistry::instance().select(PluginKind::Strategy, "sngle");
    FAIL() << "an unknown name must be refused";
  } catch (const hasten::PluginError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unknown strategy plugin 'sngle' (available: "), std::string::npos) << m;
    EXPECT_NE(m.find("single"), std::string::npos) << m;
    EXPECT_NE(m.find("did you mean 'single'"), std::string::npos) << m;
  }
}

TEST(Registry, ValidPluginWithPresetByPathAndByDirectory) {
  auto& reg = PluginRegistry::instance();
  auto result = reg.inspect(test_plugin("valid", "libhasten-tracker-valid_tracker.so"));
  ASSERT_TRUE(result.valid);
  ASSERT_EQ(result.plugins.size(), 1u);
  EXPECT_EQ(result.plugins[0].presets.at(0).name, "valid_tracker_fast");

  reg.add_search_directories({std::string(HASTEN_TEST_PLUGIN_DIR) + "/valid"});
  auto sel = reg.select(PluginKind::Tracker, "valid_tracker_fast");
  EXPECT_EQ(sel.info->name, "valid_tracker");
  EXPECT_EQ(sel.preset, "valid_tracker_fast");
  EXPECT_EQ(sel.preset_options_json, "{\"fast\": true}");

  auto by_path = reg.select(PluginKind::Tracker, test_plugin("valid", "libhasten-tracker-valid_tracker.so"));
  EXPECT_EQ(by_path.info->name, "valid_tracker");
}

TEST(RegistryRefuses, AFileThatIsNotALibrary) {
  EXPECT_NE(refusal_of("broken", "libhasten-tracker-not_a_library.so").find("not a loadable library"), std::string::npos);
}

TEST(RegistryRefuses, AMissingEntrySymbol) {
  EXPECT_NE(refusal_of("broken", "libhasten-tracker-missing_entry.so").find("missing entry symbol hasten_plugin_entry_v1"),
            std::string::npos);
}

TEST(RegistryRefuses, AnotherAbiMajor) {
  EXPECT_NE(refusal_of("broken", "libhasten-tracker-wrong_major.so").find("built for plugin ABI major 2 only"),
            std::string::npos);
  EXPECT_NE(refusal_of("broken", "libhasten-tracker-descriptor_major.so").find("built for plugin ABI 2.0"),
            std::string::npos);
  EXPECT_NE(refusal_of("broken", "libhasten-tracker-small_struct.so").find("struct_size 8, smaller than ABI 1.0's"),
            std::string::npos);
}

TEST(RegistryRefuses, ATorchFingerprintOfAnotherBuild) {
  const std::string r = refusal_of("broken", "libhasten-strategy-fingerprint_mismatch.so");
  EXPECT_NE(r.find("built against LibTorch 'torch=0.4.1;cxx11abi=0;device=cpu;stdlib=libstdc++', but this hasten "
                   "was built against 'torch="),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("[strategy/no_fingerprint] strategy plugins are torch tier and must declare"), std::string::npos) << r;
}

TEST(RegistryRefuses, AMissingRequiredSlot) {
  EXPECT_NE(refusal_of("broken", "libhasten-tracker-missing_slot.so").find("required slot 'log_scalars' is NULL"),
            std::string::npos);
}

TEST(RegistryRefuses, AnEntryPointThatFails) {
  EXPECT_NE(refusal_of("broken", "libhasten-tracker-entry_fails.so").find("entry failed on purpose: missing licence file"),
            std::string::npos);
}

TEST(RegistryRefuses, DescriptionsThatBreakTheRules) {
  const std::string r = refusal_of("broken", "libhasten-tracker-bad_description.so");
  EXPECT_NE(r.find("[tracker/with_section] config_section is for strategies only"), std::string::npos) << r;
  EXPECT_NE(r.find("[tracker/empty_enum] option 'mode' is an enum without allowed values"), std::string::npos) << r;
  EXPECT_NE(r.find("[tracker/bad_option_name] option 0 has an invalid name 'Bad-Name'"), std::string::npos) << r;
}

TEST(Registry, StrategiesDeclareTheirVocabulary) {
  auto& reg = PluginRegistry::instance();
  auto zero = reg.select(PluginKind::Strategy, "zero3");
  EXPECT_EQ(zero.info->config_section, "deepspeed_config");
  EXPECT_EQ(zero.info->distributed_types, std::vector<std::string>{"DEEPSPEED"});
  ASSERT_TRUE(zero.info->options_described);
  const auto stage = std::find_if(zero.info->options.begin(), zero.info->options.end(),
                                  [](auto& o) { return o.name == "stage"; });
  ASSERT_NE(stage, zero.info->options.end());
  EXPECT_EQ(stage->section_key, "zero_stage");
  EXPECT_EQ(stage->type, "int");
  EXPECT_EQ(*stage->max, 3.0);
  auto ddp = reg.select(PluginKind::Strategy, "ddp");
  EXPECT_EQ(ddp.info->distributed_types, (std::vector<std::string>{"MULTI_CPU", "MULTI_GPU"}));
  EXPECT_TRUE(ddp.info->config_section.empty());
  auto single = reg.select(PluginKind::Strategy, "single");
  EXPECT_TRUE(single.info->options_described);  // takes none: any key is refused
  EXPECT_TRUE(single.info->options.empty());
}

TEST(RegistryRefuses, DuplicateNames) {
  auto& reg = PluginRegistry::instance();
  reg.add_search_directories({std::string(HASTEN_TEST_PLUGIN_DIR) + "/duplicates"});
  auto sel = reg.select(PluginKind::Tracker, "duplicate");
  EXPECT_NE(sel.info->file.find("dup_a"), std::string::npos);
  bool across = false, within = false;
  for (auto& r : reg.refusals()) {
    if (r.file.find("dup_b") != std::string::npos &&
        r.reason.find("duplicate tracker name 'duplicate': already provided by") != std::string::npos &&
        r.reason.find("dup_a") != std::string::npos)
      across = true;
    if (r.plugin == "tracker/twice" && r.reason.find("declares it twice") != std::string::npos) within = true;
  }
  EXPECT_TRUE(across);
  EXPECT_TRUE(within);
}

TEST(RegistryRefuses, SelectingARefusedFileByPathSaysWhy) {
  try {
    PluginRegistry::instance().select(PluginKind::Tracker, test_plugin("broken", "libhasten-tracker-missing_slot.so"));
    FAIL() << "a refused file must not be selectable";
  } catch (const hasten::PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("was refused: required slot 'log_scalars' is NULL"), std::string::npos) << e.what();
  }
}

// The host's option look-ups (ABI 1.1) through the SDK's Options, as a plugin reads them.
namespace hasten::detail {
const hasten_host_api* registry_host();
}

TEST(HostOptions, TypedLookUpsAndUnknownKeys) {
  const hasten_host_api* host = hasten::detail::registry_host();
  using hasten::sdk::Options;
  const std::string json =
      R"({"n": 3, "x": 0.5, "on": true, "name": "abc", "items": ["a", "bcd"], "one": "z", "nothing": null})";
  const Options o(host, json, "demo", {"n", "x", "on", "name", "items", "one", "nothing", "absent"});
  EXPECT_EQ(o.integer("n"), 3);
  EXPECT_EQ(o.number("n"), 3.0);  // integers are numbers too
  EXPECT_EQ(o.number("x"), 0.5);
  EXPECT_EQ(o.boolean("on"), true);
  EXPECT_EQ(o.text("name"), "abc");
  EXPECT_EQ(o.list("items"), (std::vector<std::string>{"a", "bcd"}));
  EXPECT_EQ(o.list("one"), (std::vector<std::string>{"z"}));
  EXPECT_FALSE(o.integer("absent").has_value());
  EXPECT_FALSE(o.text("nothing").has_value());  // null is absent, as in config files
  auto message = [&](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const hasten::sdk::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(message([&] { (void)o.integer("x"); }), "option x: expected an integer, got 0.5");
  EXPECT_EQ(message([&] { (void)o.boolean("name"); }), "option name: expected true or false, got \"abc\"");
  EXPECT_EQ(message([&] { (void)o.list("n"); }), "option n: expected a list of strings, got 3");
  EXPECT_EQ(message([&] { Options(host, R"({"bucket": 1})", "demo", {"buckets", "dim"}); }),
            "demo options: unknown key 'bucket' (allowed: buckets, dim); did you mean 'buckets'?");
  EXPECT_EQ(message([&] { Options(host, R"({"a": 1})", "demo", {}); }), "demo options: unknown key 'a' (allowed: none)");
  EXPECT_NE(message([&] { Options(host, "[1]", "demo", {}); }).find("not a JSON object"), std::string::npos);
  // A too small buffer is an error that says the size needed; capacity 0 only asks.
  char small[2];
  size_t size = 0;
  int32_t found = 0;
  EXPECT_EQ(host->option_string(host, json.c_str(), "name", nullptr, 0, &size, &found), HASTEN_OK);
  EXPECT_EQ(size, 4u);
  EXPECT_EQ(host->option_string(host, json.c_str(), "name", small, sizeof small, &size, &found),
            HASTEN_ERR_INVALID_ARGUMENT);
}

// A plugin's option defaults live once, in its described options: the SDK's Options reads an
// absent key's default_json, a set key's value, and nothing for a key described without one.
TEST(HostOptions, AbsentKeysReadTheirDescribedDefault) {
  const hasten_host_api* host = hasten::detail::registry_host();
  using hasten::sdk::OptionSpec;
  static constexpr hasten_option_spec specs[] = {
      OptionSpec("cap", HASTEN_OPTION_FLOAT, "a size").default_json("25"),
      OptionSpec("on", HASTEN_OPTION_BOOL, "a switch").default_json("true"),
      OptionSpec("mode", HASTEN_OPTION_ENUM, "a mode").allowed("a,b").default_json("\"b\""),
      OptionSpec("n", HASTEN_OPTION_INT, "a count").default_json("7"),
      OptionSpec("free", HASTEN_OPTION_STRING, "no default"),
  };
  const hasten::sdk::Options unset(host, "{}", specs);
  EXPECT_EQ(unset.number("cap"), 25.0);
  EXPECT_EQ(unset.boolean("on"), true);
  EXPECT_EQ(unset.text("mode"), "b");
  EXPECT_EQ(unset.integer("n"), 7);
  EXPECT_FALSE(unset.text("free").has_value());
  const hasten::sdk::Options set(host, R"({"cap": 4, "on": false, "mode": "a", "n": 1, "free": "x"})", specs);
  EXPECT_EQ(set.number("cap"), 4.0);
  EXPECT_EQ(set.boolean("on"), false);
  EXPECT_EQ(set.text("mode"), "a");
  EXPECT_EQ(set.integer("n"), 1);
  EXPECT_EQ(set.text("free"), "x");
  // Without the description an absent key stays absent.
  EXPECT_FALSE(hasten::sdk::Options(host, "{}").number("cap").has_value());
}
