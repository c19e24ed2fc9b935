// `hasten config`: the questionnaire (config_wizard.cpp); `hasten config default`: writes a
// default config file (never over an existing one); `hasten config keys`: every key with its
// type, default, allowed values and env variable; `hasten config show` (config_show.cpp).
#include <hasten/config.hpp>
#include <hasten/error.hpp>
#include <hasten/process.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "commands.hpp"

namespace hasten::cli {

void add_config_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("config", "Write or describe config files (alone: the questionnaire)");
  cmd->require_subcommand(0, 1);
  add_config_wizard(*cmd, action);
  add_config_show_command(*cmd, action);
  auto* def = cmd->add_subcommand("default", "Write a default config file (refuses to overwrite)");
  auto file = std::make_shared<std::string>();
  auto precision = std::make_shared<std::string>("no");
  def->add_option("--config_file,--config-file", *file, "Where to write (default: the user's default file)");
  def->add_option("--mixed_precision,--mixed-precision", *precision, "no, fp16 or bf16");
  def->callback([&action, file, precision] {
    action = [file, precision]() -> int {
      const std::string path = file->empty() ? default_config_path(current_environment()) : *file;
      if (path.empty())
        return report_error("there is no home directory for the default config file (HOME is unset and the user has "
                            "none); pass --config_file or set HASTEN_HOME");
      const std::string text = default_config_yaml(*precision);  // validates the value
      std::error_code ec;
      if (std::filesystem::exists(path, ec))
        return report_error("config file '" + path + "' already exists; not overwriting it");
      const auto parent = std::filesystem::path(path).parent_path();
      if (!parent.empty()) std::filesystem::create_directories(parent, ec);
      if (ec) return report_error("cannot create directory '" + parent.string() + "': " + ec.message());
      std::ofstream out(path);
      out << text;
      out.close();
      if (!out) return report_error("cannot write config file '" + path + "'");
      std::cout << "hasten: wrote " << path << std::endl;
      return 0;
    };
  });
  auto* keys = cmd->add_subcommand("keys", "List every config key (tab-separated)");
  keys->callback([&action] {
    action = []() -> int {
      std::cout << "key\ttype\tdefault\tallowed\tenvironment\tdescription\n";
      for (auto& row : config_key_table()) std::cout << row << "\n";
      return 0;
    };
  });
}

}  // namespace hasten::cli
