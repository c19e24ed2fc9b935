// What a program prints for an error that ends it. A c10::Error's what() carries
// "Exception raised from ..." and the C++ stack after its message, and an error can arrive
// with no text at all (a peer's failure relayed without one): neither is a line a user can act on.
#pragma once

#include <string>
#include <typeinfo>

namespace hasten::cli {

inline std::string error_line(const std::exception& e) {
  std::string text = e.what() != nullptr ? e.what() : "";
  const auto frames = text.find("Exception raised from ");
  if (frames != std::string::npos) text.erase(frames);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\n' || text.back() == '\r' || text.back() == '\t'))
    text.pop_back();
  if (text.empty()) return std::string("an error without a message (") + typeid(e).name() + ")";
  return text;
}

}  // namespace hasten::cli
