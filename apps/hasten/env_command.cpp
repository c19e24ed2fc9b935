// `hasten env`: what a bug report needs: versions, BLAS, GPUs, plugins, the resolved config.
#include <hasten/config.hpp>
#include <hasten/registry.hpp>
#include <hasten/runtime_info.hpp>

#include <nlohmann/json.hpp>

#include <iostream>

#include "commands.hpp"

namespace hasten::cli {

void add_env_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("env", "Print versions, BLAS, GPUs, plugins and the resolved config");
  auto config_file = std::make_shared<std::string>();
  cmd->add_option("--config_file,--config-file", *config_file, "Config file to resolve");
  cmd->callback([&action, config_file] {
    action = [config_file]() -> int {
      Options options;
      if (!config_file->empty()) options.config_file = *config_file;
      const Config config = resolve_config(options);  // a bad file is an error, exit 1
      auto& registry = PluginRegistry::instance();
      registry.add_search_directories(config.plugin_path);
      const RuntimeInfo rt = runtime_info();
      std::cout << "hasten version:     " << rt.hasten_version << "\n"
                << "LibTorch:           " << rt.torch_version << " (" << rt.torch_fingerprint << ")\n"
                << "compiler:           " << rt.compiler << "\n"
                << "BLAS:               " << rt.blas.summary() << "\n"
                << (rt.blas.library != "openblas" ? std::string() : "OpenBLAS kernel:    " + [] {
                     const auto a = openblas_coretype_advice();
                     const char* env = std::getenv("OPENBLAS_CORETYPE");
                     if (env) return std::string("OPENBLAS_CORETYPE=") + env + " (from the environment)";
                     return a.coretype.empty() ? std::string("OpenBLAS's own choice (no better family on this CPU)")
                                               : a.reason + "; hasten launch sets OPENBLAS_CORETYPE=" + a.coretype;
                   }() + "\n")
                << "CUDA available:     " << (rt.cuda_available ? "yes" : "no") << " ("
                << rt.cuda_devices << " devices)\n";
      bool nccl = false;
      for (auto& p : registry.plugins()) nccl = nccl || (p.kind == PluginKind::Comm && p.name == "nccl");
      std::cout << "NCCL comm plugin:   " << (nccl ? "present" : "not present") << "\n"
                << "plugin search path:\n";
      for (auto& d : registry.search_path()) std::cout << "  " << d << "\n";
      std::cout << "plugins:\n";
      for (auto& p : registry.plugins())
        std::cout << "  " << to_string(p.kind) << "/" << p.name << " " << p.version << " ("
                  << p.tier << " tier) " << p.file << "\n";
      for (auto& r : registry.refusals())
        std::cout << "  refused: " << r.file << (r.plugin.empty() ? "" : " [" + r.plugin + "]")
                  << ": " << r.reason << "\n";
      std::cout << "config file:        " << (config.config_file.empty() ? "(none)" : config.config_file)
                << "\nresolved config:\n"
                << nlohmann::json::parse(config.resolved_json).dump(2) << std::endl;
      return 0;
    };
  });
}

}  // namespace hasten::cli
