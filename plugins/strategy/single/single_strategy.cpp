// Strategy "single": one process, one device. The model moves to the run's device; nothing
// is wrapped, synchronised or sharded, so every other slot stays NULL and costs nothing.
#include <hasten/plugin_torch.hpp>

namespace {

class SingleStrategy final : public hasten::sdk::Strategy {
 public:
  SingleStrategy(const hasten_host_api* host, std::string_view) : Strategy(host) {}  // takes no options
  void prepare_model(torch::nn::Module& model, const hasten_model_info& info) override {
    model.to(hasten::sdk::torch_device(info.device));
  }
};

constexpr hasten_plugin_descriptor kSingle = hasten::sdk::answering(
    hasten::sdk::without_options(hasten::sdk::strategy_descriptor<SingleStrategy>(
        "single", "1.0", "One process on one device: no gradient communication")),
    "NO");

}  // namespace

HASTEN_PLUGIN_LIBRARY(&kSingle)
