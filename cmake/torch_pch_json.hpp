// Part of the LibTorch precompiled header under Clang (HastenTorchPch.cmake): nlohmann::json,
// which the core, the programs' --json reports and the tests parse and write, with the
// operations they use instantiated once here. Clang keeps the instantiations of a PCH
// (-fpch-instantiate-templates) and each unit that uses them reads them back, instead of
// instantiating basic_json again (~3 s of a program's unit). GCC redoes a PCH's pending
// instantiations in every unit, used or not, so its PCH leaves this out.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace hasten::pch {

// Never called: its body is what gets instantiated.
inline void instantiate_json(std::ostream& out) {
  const std::vector<double> doubles{1.0};
  const std::vector<int64_t> ints{1};
  const std::vector<std::string> strings{"s"};
  nlohmann::ordered_json o{{"d", 1.0}, {"i", int64_t{1}}, {"u", uint64_t{1}}, {"n", 1}, {"b", true},
                           {"c", "s"}, {"s", std::string("s")}, {"vd", doubles}, {"vi", ints}, {"vs", strings}};
  o["k"] = nlohmann::ordered_json::array();
  o["k"].push_back(o);
  out << o.dump() << o.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  nlohmann::json j = nlohmann::json::parse("{}");
  j["d"] = 1.0;
  out << j.dump(2) << j.contains("d") << j.value("d", 0.0) << j["d"].get<double>() << j["d"].get<int64_t>()
      << j["d"].get<std::string>().size() << j.is_object();
  for (auto& [key, value] : j.items()) out << key << value;
}

}  // namespace hasten::pch
