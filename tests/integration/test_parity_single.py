"""Single-process training through hasten is the plain LibTorch loop and PyTorch's own loop to
the last bit: losses, every gradient after every backward and every parameter after every
step, on mlp-small for 20 steps and gpt-tiny for 8, in float32 and under bf16 autocast (gpt-tiny
for 4 there; its encoder layers run attention as
PyTorch's Python layer does in training, need_weights=False, and call aten::linear as Python's
F.linear does). The three runs make the same LibTorch calls in the same order with the same
thread pools (docs/strategies.md, "What equal means"), so nothing here needs a tolerance."""
import harness as h


def pytorch_refuses(steps, bf16):
    """PyTorch's own reason not to run the workload here, or None. Under a CPU capability
    forced below the machine's (test_parity_kernels.py), PyTorch's bf16 kernels on an AMX CPU
    refuse to pack their weights ("pack_vnni2 is only supported when avx512 is supported"): the
    plain PyTorch loop fails as hasten does, so there is nothing to compare."""
    if not bf16:
        return None
    p = h.run(h.peer(*steps, "--mode", "bf16"), timeout=300)
    if p.returncode != 0 and "is only supported when" in p.stderr:
        return p.stderr.strip().splitlines()[-1]
    return None


for workload, steps, bf16 in (("mlp-small", 20, False), ("gpt-tiny", 8, False), ("mlp-small", 20, True),
                              ("gpt-tiny", 4, True)):
    STEPS = ["--workload", workload, "--warmup", "0", "--steps", str(steps)]
    precision = ["--mixed_precision", "bf16"] if bf16 else []
    workload += " bf16" if bf16 else ""
    refused = pytorch_refuses(STEPS, bf16)
    if refused:
        print(f"{workload}: skipped, PyTorch itself refuses it under this CPU capability: {refused}")
        continue
    ours = h.traced(h.example(*STEPS, *precision, "--log-every", "0"))
    plain = h.traced(h.example(*STEPS, *precision, "--impl", "libtorch"))
    torch = h.traced(h.peer(*STEPS, "--mode", "bf16" if bf16 else "single"))
    if len(ours.losses) != steps:
        h.fail(f"{workload}: expected {steps} losses, got {len(ours.losses)}")
    h.check_bitwise(f"{workload}: hasten vs the plain LibTorch loop", ours, plain)
    h.check_bitwise(f"{workload}: hasten vs PyTorch", ours, torch)
    # The losses must move: a run that did not train would match trivially only at step 0.
    if abs(ours.losses[0] - ours.losses[-1]) < 1e-3:
        h.fail(f"{workload}: the loss did not change over {steps} steps")
print("parity single: OK")
