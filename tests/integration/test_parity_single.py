"""Single-process training of mlp-small through hasten gives the same 20 losses as the plain
LibTorch loop (within 1e-6) and as the PyTorch peer (within 1e-5)."""
import harness as h

STEPS = ["--workload", "mlp-small", "--warmup", "0", "--steps", "20"]
ours = h.losses(h.example(*STEPS, "--log-every", "0"))
plain = h.losses(h.example(*STEPS, "--impl", "libtorch"))
torch = h.losses(h.peer(*STEPS, "--mode", "single"))
if len(ours) != 20:
    h.fail(f"expected 20 losses, got {len(ours)}")
d_plain, d_torch = h.max_abs_diff(ours, plain), h.max_abs_diff(ours, torch)
print(f"max |hasten - libtorch| = {d_plain:.3g}, max |hasten - torch| = {d_torch:.3g}")
if d_plain > 1e-6:
    h.fail(f"hasten and the plain LibTorch loop differ by {d_plain}")
if d_torch > 1e-5:
    h.fail(f"hasten and PyTorch differ by {d_torch}")
# The losses must move: a run that did not train would match trivially only at step 0.
if abs(ours[0] - ours[-1]) < 1e-3:
    h.fail("the loss did not change over 20 steps")
