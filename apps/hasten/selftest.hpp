// hasten-selftest's training run (selftest.cpp) and its verdict, apart from the command line
// (selftest_main.cpp): the run includes LibTorch and hasten, the command line CLI11, and each
// compiles alone (an edit of hasten's headers does not recompile CLI11's).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace hasten::selftest {

// A check that did not hold: its message is the rank's verdict.
struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Trains `steps` steps on the launcher's config and returns this rank's verdict; throws
// CheckFailed when a check does not hold, any other error when the run cannot go on.
nlohmann::ordered_json run(int64_t steps);

// Writes `result` to <dir>/rank_<rank>.json (nothing when dir is empty).
void write_result(const std::string& dir, int rank, const nlohmann::ordered_json& result);

}  // namespace hasten::selftest
