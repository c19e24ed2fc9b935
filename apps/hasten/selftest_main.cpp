// hasten-selftest's command line: parses the flags and runs selftest.cpp's training.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>
#include <string>

#include "../cli_checks.hpp"
#include "../error_line.hpp"
#include "selftest.hpp"

using hasten::selftest::CheckFailed;
using hasten::selftest::run;
using hasten::selftest::write_result;

int main(int argc, char** argv) {
  CLI::App app{"hasten-selftest: the training run of `hasten test` (start it through hasten test or hasten launch)"};
  int64_t steps = 60;
  std::string result_dir;
  app.add_option("--steps", steps, "Training steps")->check(hasten::cli::integer_in(10, 100000));
  app.add_option("--result", result_dir, "Directory for each rank's verdict (rank_<r>.json)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "hasten-selftest: error: " << e.what() << std::endl;
    return 2;
  }
  // The rank for the verdict's file name, before the Accelerator (whose construction can fail).
  int rank = 0;
  if (const char* r = std::getenv("RANK")) rank = std::atoi(r);
  try {
    const auto result = run(steps);
    write_result(result_dir, rank, result);
    return 0;
  } catch (const std::exception& e) {
    const std::string line = hasten::cli::error_line(e);
    write_result(result_dir, rank, {{"rank", rank}, {"ok", false}, {"error", line},
                                    {"check", dynamic_cast<const CheckFailed*>(&e) != nullptr}});
    std::cerr << "hasten-selftest: error: " << line << std::endl;
    return 1;
  }
}
