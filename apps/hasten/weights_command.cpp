// `hasten merge-weights PATH OUT`: one safetensors file from sharded weights
// (model.safetensors.index.json and its shards, as Accelerator::save_model writes them) or
// from a checkpoint directory.
#include <hasten/error.hpp>
#include <hasten/weights.hpp>

#include <iostream>
#include <memory>

#include "commands.hpp"

namespace hasten::cli {

void add_weights_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("merge-weights", "Merge sharded weights (or a checkpoint's) into one safetensors file");
  auto path = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("PATH", *path, "A directory with model.safetensors.index.json, a checkpoint directory, or a file")
      ->required();
  cmd->add_option("OUT", *out, "The safetensors file to write")->required();
  cmd->callback([&action, path, out] {
    action = [path, out]() -> int {
      try {
        merge_weights(*path, *out);
      } catch (const Error& e) {
        return report_error(e.what());
      }
      std::cout << "wrote " << *out << std::endl;
      return 0;
    };
  });
}

}  // namespace hasten::cli
