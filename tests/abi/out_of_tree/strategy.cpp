// An out-of-tree strategy in C++ (torch tier): one process, and it counts the optimizer steps
// it sees, writing the count to the file named by its option "count_file" when destroyed. It
// owns a vocabulary the core has never heard of: the config section `oot_config` and the
// distributed_type value OOT_COUNTING, so that a config file selects and sets it like
// Accelerate's own strategies.
#include <hasten/plugin_torch.hpp>

#include <fstream>

namespace {

class CountingStrategy final : public hasten::sdk::Strategy {
 public:
  CountingStrategy(const hasten_host_api* host, std::string_view options) : Strategy(host) {
    const hasten::sdk::Options o(host, options);  // keys and types checked by the host
    auto path = o.text("count_file");
    if (!path) throw hasten::sdk::Error(HASTEN_ERR_INVALID_ARGUMENT, "oot_cpp needs the option count_file");
    path_ = *path;
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

constexpr hasten_option_spec kOptions[] = {
    hasten::sdk::OptionSpec("count_file", HASTEN_OPTION_STRING, "Where the step count is written at the end")
        .section_key("count_file"),
};

constexpr hasten_plugin_descriptor kCounting = hasten::sdk::answering(
    hasten::sdk::with_options(
        hasten::sdk::strategy_descriptor<CountingStrategy>("oot_cpp", "0.1", "out-of-tree strategy in C++"), kOptions),
    "OOT_COUNTING", "oot_config");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kCounting)
