"""Single-process training through hasten gives the same losses as the plain LibTorch loop
(within 1e-6) and as the PyTorch peer (within 1e-5): mlp-small for 20 steps, and gpt-tiny for 8
(its encoder layers run attention as PyTorch's Python layer does in training, need_weights=False;
measured: equal to the peer for 3 steps, then within 3e-6)."""
import harness as h

for workload, steps in (("mlp-small", 20), ("gpt-tiny", 8)):
    STEPS = ["--workload", workload, "--warmup", "0", "--steps", str(steps)]
    ours = h.losses(h.example(*STEPS, "--log-every", "0"))
    plain = h.losses(h.example(*STEPS, "--impl", "libtorch"))
    torch = h.losses(h.peer(*STEPS, "--mode", "single"))
    if len(ours) != steps:
        h.fail(f"{workload}: expected {steps} losses, got {len(ours)}")
    d_plain, d_torch = h.max_abs_diff(ours, plain), h.max_abs_diff(ours, torch)
    print(f"{workload}: max |hasten - libtorch| = {d_plain:.3g}, max |hasten - torch| = {d_torch:.3g}")
    if d_plain > 1e-6:
        h.fail(f"{workload}: hasten and the plain LibTorch loop differ by {d_plain}")
    if d_torch > 1e-5:
        h.fail(f"{workload}: hasten and PyTorch differ by {d_torch}")
    # The losses must move: a run that did not train would match trivially only at step 0.
    if abs(ours[0] - ours[-1]) < 1e-3:
        h.fail(f"{workload}: the loss did not change over {steps} steps")
