// Activation checkpointing (unit.hpp: checkpointed units): PyTorch's reentrant checkpoint,
// torch.utils.checkpoint(use_reentrant=True), for LibTorch. The forward runs without autograd
// and saves only its inputs; backward runs it again with autograd, under the RNG and autocast
// state of the forward (so dropout draws the same masks and a bf16 forward is bf16 again), and
// backpropagates through that graph: the parameters get their gradients there, as they would
// have in one pass, and the inputs' gradients go on to the layers before.
#include <hasten/error.hpp>
#include <hasten/torch_compat.hpp>
#include <hasten/unit.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <optional>
#include <string>

namespace hasten::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs that is not a tensor: the function to run again, the RNG and autocast
// state of the forward. Kept in the autograd context as a capsule.
struct CheckpointState : torch::CustomClassHolder {
  std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)> run;
  at::Tensor cpu_rng;
  std::optional<c10::Device> cuda_device;  // the CUDA device of the inputs, whose generator is replayed too
  at::Tensor cuda_rng;
  bool autocast_cpu = false, autocast_cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;
  size_t n_inputs = 0;
};

// The autocast state of this thread, set for the recompute and put back after it, entered and
// left as torch.autocast does: counted in the nesting, and the cast cache (bf16 copies of the
// weights, keyed by weight) cleared when the outermost region ends. A region left uncounted
// would leave its casts cached past the optimizer step that changes the weights.
struct AutocastAs {
  explicit AutocastAs(const CheckpointState& s)
      : cpu(compat::autocast_enabled(at::kCPU)), cuda(compat::autocast_enabled(at::kCUDA)),
        cpu_dtype(compat::autocast_dtype(at::kCPU)), cuda_dtype(compat::autocast_dtype(at::kCUDA)) {
    compat::set_autocast_enabled(at::kCPU, s.autocast_cpu);
    compat::set_autocast_enabled(at::kCUDA, s.autocast_cuda);
    compat::set_autocast_dtype(at::kCPU, s.cpu_dtype);
    compat::set_autocast_dtype(at::kCUDA, s.cuda_dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastAs() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    compat::set_autocast_enabled(at::kCPU, cpu);
    compat::set_autocast_enabled(at::kCUDA, cuda);
    compat::set_autocast_dtype(at::kCPU, cpu_dtype);
    compat::set_autocast_dtype(at::kCUDA, cuda_dtype);
  }
  bool cpu, cuda;
  at::ScalarType cpu_dtype, cuda_dtype;
};

// Sets the generators to their state at the forward, and back to their state now when done.
struct RngReplay {
  explicit RngReplay(const CheckpointState& s) : cpu(at::detail::getDefaultCPUGenerator()) {
    cpu_now = cpu.get_state();
    cpu.set_state(s.cpu_rng);
    if (s.cuda_device) {
      cuda = at::globalContext().defaultGenerator(*s.cuda_device);
      cuda_now = cuda->get_state();
      cuda->set_state(s.cuda_rng);
    }
  }
  ~RngReplay() {
    cpu.set_state(cpu_now);
    if (cuda) cuda->set_state(cuda_now);
  }
  at::Generator cpu;  // handles: they share the generators
  at::Tensor cpu_now;
  std::optional<at::Generator> cuda;
  at::Tensor cuda_now;
};

struct Checkpoint : torch::autograd::Function<Checkpoint> {
  // `anchor` is a zero-size tensor that requires grad: the outputs then always have this node
  // as their grad_fn, even when no input requires grad (the first layer's input is data), so
  // backward reaches the parameters inside.
  // `inputs` as a TensorList: LibTorch's Function counts each of its tensors as an input (a
  // std::vector would count as one non-tensor argument).
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<CheckpointState> state, at::Tensor anchor,
                               at::TensorList inputs) {
    (void)anchor;
    state->n_inputs = inputs.size();
    state->cpu_rng = at::detail::getDefaultCPUGenerator().get_state();
    for (const auto& t : inputs)
      if (t.defined() && t.is_cuda()) {
        state->cuda_device = t.device();
        state->cuda_rng = at::globalContext().defaultGenerator(t.device()).get_state();
        break;
      }
    state->autocast_cpu = compat::autocast_enabled(at::kCPU);
    state->autocast_cuda = compat::autocast_enabled(at::kCUDA);
    state->cpu_dtype = compat::autocast_dtype(at::kCPU);
    state->cuda_dtype = compat::autocast_dtype(at::kCUDA);
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    torch::NoGradGuard no_grad;
    return state->run(inputs.vec());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    std::vector<torch::Tensor> inputs;
    inputs.reserve(saved.size());
    for (const auto& t : saved) {
      auto d = t.detach();
      if (t.requires_grad()) d.requires_grad_(true);
      inputs.push_back(d);
    }
    std::vector<torch::Tensor> outputs;
    {
      // The forward's random draws again (dropout), then this thread's generator as it was.
      // (CPU's, and the inputs' CUDA device's, as torch.utils.checkpoint forks them).
      RngReplay replay(*state);
      AutocastAs autocast(*state);
      torch::AutoGradMode grad(true);
      outputs = state->run(inputs);
    }
    std::vector<torch::Tensor> roots, grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i)
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    variable_list result;
    result.reserve(2 + inputs.size());
    result.emplace_back();  // state: not a tensor
    result.emplace_back();  // anchor
    for (auto& in : inputs) result.push_back(in.requires_grad() ? in.grad() : torch::Tensor());
    return result;
  }
};

}  // namespace

std::vector<torch::Tensor> run_checkpointed(
    std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)> run,
    const std::vector<torch::Tensor>& inputs) {
  auto state = c10::make_intrusive<CheckpointState>();
  state->run = std::move(run);
  static thread_local const at::Tensor anchor = torch::empty({0}).requires_grad_(true);
  return Checkpoint::apply(state, anchor, at::TensorList(inputs));
}

void refuse_checkpointed_output(const char* type) {
  throw UsageError(std::string("activation checkpointing: a checkpointed unit's forward must return one tensor; this "
                               "one returns ") +
                   type + " (checkpoint the units inside it instead)");
}

}  // namespace hasten::detail
