// An out-of-tree strategy in C++ (torch tier): one process, and it counts the optimizer steps
// it sees, writing the count to the file named by its option "count_file" when destroyed.
#include <hasten/plugin.hpp>

#include <fstream>

namespace {

class CountingStrategy final : public hasten::sdk::Strategy {
 public:
  CountingStrategy(const hasten_host_api* host, std::string_view options) : Strategy(host) {
    const std::string o(options);
    const std::string key = "\"count_file\":\"";
    const auto at = o.find(key);
    if (at == std::string::npos)
      throw hasten::sdk::Error(HASTEN_ERR_INVALID_ARGUMENT, "oot_cpp needs strategy_options.count_file");
    path_ = o.substr(at + key.size(), o.find('"', at + key.size()) - at - key.size());
  }
  ~CountingStrategy() override { std::ofstream(path_) << steps_ << "\n"; }
  void prepare_model(torch::nn::Module& model, const hasten_model_info&) override {
    hasten::sdk::log(host(), HASTEN_LOG_INFO, "oot_cpp",
                     "prepared a model with " + std::to_string(model.parameters().size()) + " tensors");
  }
  void after_optimizer_step(torch::optim::Optimizer&) override { ++steps_; }

 private:
  std::string path_;
  int steps_ = 0;
};

constexpr hasten_plugin_descriptor kCounting = hasten::sdk::strategy_descriptor<CountingStrategy>(
    "oot_cpp", "0.1", "out-of-tree strategy in C++");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kCounting)
