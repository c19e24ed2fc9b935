// The C-tier SDK helpers a plugin author writes against, compiled (not run) by every C++
// compiler on the machine, not only the one hasten is built with: a plugin is built by its
// author's compiler. The constexpr option table is what Clang once refused (a member template
// called in a constant expression before its definition in the class).
#include <hasten/plugin.hpp>

namespace sdk = hasten::sdk;

constexpr hasten_option_spec kOptions[] = {
    sdk::OptionSpec("stage", HASTEN_OPTION_INT, "ZeRO stage").range(0, 3).default_json("0").section_key("zero_stage"),
    sdk::OptionSpec("device", HASTEN_OPTION_ENUM, "Where").allowed("none,cpu").default_json("\"none\""),
    sdk::section_only_key("zero3_save_16bit_model", HASTEN_OPTION_BOOL, "Accelerate's; no effect here"),
};
static_assert(kOptions[0].max == 3.0 && (kOptions[0].flags & HASTEN_OPTION_HAS_MAX) != 0, "range() sets max");
static_assert(kOptions[2].name == nullptr, "a section-only key names no option");

int main() { return kOptions[1].type == HASTEN_OPTION_ENUM ? 0 : 1; }
