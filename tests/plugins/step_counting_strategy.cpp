// A torch-tier strategy built with the SDK that counts the calls it receives, so tests can
// see exactly when the host calls which slot. Counts go to the file named by its option
// "trace_file" as one line per call: "<slot> <argument>".
#include <hasten/plugin_torch.hpp>

#include <fstream>

namespace {

class TracingStrategy final : public hasten::sdk::Strategy {
 public:
  TracingStrategy(const hasten_host_api* host, std::string_view options) : Strategy(host) {
    const std::string o(options);
    const std::string key = "\"trace_file\":\"";
    const auto at = o.find(key);
    if (at == std::string::npos)
      throw hasten::sdk::Error(HASTEN_ERR_INVALID_ARGUMENT, "tracing strategy needs option trace_file");
    const auto end = o.find('"', at + key.size());
    out_.open(o.substr(at + key.size(), end - at - key.size()));
  }
  void prepare_model(torch::nn::Module& model, const hasten_model_info& info) override {
    out_ << "prepare_model " << info.index << " params " << model.parameters().size() << "\n";
  }
  void prepare_optimizer(torch::optim::Optimizer&) override { out_ << "prepare_optimizer\n"; }
  void set_gradient_sync(torch::nn::Module&, bool enabled) override {
    out_ << "set_gradient_sync " << enabled << "\n";
  }
  void before_backward() override { out_ << "before_backward\n"; }
  void after_backward() override { out_ << "after_backward\n"; }
  void before_optimizer_step(torch::optim::Optimizer&) override { out_ << "before_optimizer_step\n"; }
  void after_optimizer_step(torch::optim::Optimizer&) override {
    out_ << "after_optimizer_step\n";
    out_.flush();
  }

 private:
  std::ofstream out_;
};

constexpr hasten_plugin_descriptor kTracing = hasten::sdk::strategy_descriptor<TracingStrategy>(
    "tracing", "0.1", "records every call (tests)");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kTracing)
