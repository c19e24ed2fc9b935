"""hasten config (the questionnaire, driven through a pseudo-terminal), hasten config show (where
each value came from) and Accelerate's launch flags (--use_deepspeed, --zero_stage, --use_fsdp,
--fsdp_sharding_strategy, --multi_gpu, --cpu) as hasten launch --dry_run resolves them."""
import json
import os
import pty
import select
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(__file__))
from harness import check_clean_failure, fail, hasten, run  # noqa: E402

# The keys of Accelerate's ClusterConfig (config_args.py) with its deepspeed_config and
# fsdp_config keys: a file made only of these is one Accelerate's launcher loads.
ACCELERATE_KEYS = {
    "compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug", "num_processes",
    "num_machines", "machine_rank", "main_process_ip", "main_process_port", "rdzv_backend", "same_network",
    "gpu_ids", "main_training_function", "downcast_bf16", "enable_cpu_affinity", "tpu_name", "tpu_zone",
    "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm", "tpu_env", "deepspeed_config",
    "fsdp_config", "fp8_config", "dynamo_config", "mpirun_config", "parallelism_config", "megatron_lm_config",
}
DEEPSPEED_KEYS = {
    "deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
    "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_accumulation_steps", "gradient_clipping",
    "zero3_save_16bit_model", "zero3_init_flag", "deepspeed_moe_layer_cls_names", "deepspeed_multinode_launcher",
    "deepspeed_hostfile", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter",
}
FSDP_KEYS = {
    "fsdp_version", "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "fsdp_offload_params",
    "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params", "fsdp_backward_prefetch",
    "fsdp_state_dict_type", "fsdp_forward_prefetch", "fsdp_use_orig_params", "fsdp_cpu_ram_efficient_loading",
    "fsdp_sync_module_states", "fsdp_activation_checkpointing", "fsdp_ignored_modules",
}


class Terminal:
    """hasten config on a pseudo-terminal: answer() waits for the next prompt (a line ending
    in ': ') and types a line."""

    def __init__(self, args, env):
        master, slave = pty.openpty()
        full_env = dict(os.environ)
        full_env.update(env)
        self.proc = subprocess.Popen(hasten(*args), stdin=slave, stdout=slave, stderr=subprocess.PIPE,
                                     env=full_env, close_fds=True)
        os.close(slave)
        self.master = master
        self.seen = ""  # everything printed so far
        self.read_to = 0

    def _read(self):
        # A hang guard only (a broken wizard must not stall make test), not a timing check.
        ready, _, _ = select.select([self.master], [], [], 60)
        if not ready:
            fail(f"hasten config printed nothing for 60 s; output so far:\n{self.seen}")
        try:
            chunk = os.read(self.master, 4096).decode()
        except OSError:  # the other side closed: the process ended
            return False
        if not chunk:
            return False
        self.seen += chunk
        return True

    def prompt(self):
        """Text since the last answer, up to and including the next prompt."""
        while not self.seen.rstrip(" ").endswith(":") or len(self.seen) <= self.read_to:
            if not self._read():
                fail(f"hasten config ended while a prompt was expected; output:\n{self.seen}")
        text = self.seen[self.read_to:]
        self.read_to = len(self.seen)
        return text

    def answer(self, line, expect=None):
        text = self.prompt()
        if expect and expect not in text:
            fail(f"expected '{expect}' before the prompt, got:\n{text}")
        os.write(self.master, (line + "\n").encode())
        return text

    def eof(self):
        self.prompt()
        os.write(self.master, b"\x04")  # ^D on an empty line: end of input

    def finish(self):
        while self._read():
            pass
        rc = self.proc.wait(timeout=60)
        err = self.proc.stderr.read().decode()
        os.close(self.master)
        return rc, self.seen, err


def wizard_writes_deepspeed_file(tmp):
    home = os.path.join(tmp, "home")
    t = Terminal(["config"], {"HASTEN_HOME": home})
    t.answer("", "compute environment")  # Enter: this machine
    t.answer("BOGUS", "distributed training")
    t.answer("DEEPSPEED", "'BOGUS' is not allowed (allowed:")
    t.answer("7", "deepspeed_config.zero_stage")
    t.answer("3", "'7' is not allowed (allowed: an integer from 0 to 3)")
    t.answer("", "deepspeed_config.offload_optimizer_device")  # default none
    t.answer("cpu", "deepspeed_config.offload_param_device")
    t.answer("1.5", "deepspeed_config.gradient_clipping")
    t.answer("0", "processes in total")
    t.answer("2", "'0' is not allowed")
    t.answer("bf16", "Mixed precision")
    t.answer("", "Trackers")  # none
    rc, out, err = t.finish()
    path = os.path.join(home, "default_config.yaml")
    if rc != 0 or "wrote " + path not in out:
        fail(f"hasten config exited {rc}\nout:\n{out}\nerr:\n{err}")
    with open(path) as f:
        written = yaml.safe_load(f)
    expected = {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "mixed_precision": "bf16",
        "num_machines": 1, "num_processes": 2, "machine_rank": 0, "main_process_port": 29500,
        "rdzv_backend": "static", "same_network": True, "use_cpu": True, "debug": False,
        "deepspeed_config": {"zero_stage": 3, "offload_optimizer_device": "none", "offload_param_device": "cpu",
                             "gradient_clipping": 1.5},
    }
    if written != expected:
        fail(f"the questionnaire wrote\n{written}\nexpected\n{expected}")
    if set(written) - ACCELERATE_KEYS or set(written["deepspeed_config"]) - DEEPSPEED_KEYS:
        fail(f"keys Accelerate's launcher does not know: {set(written) - ACCELERATE_KEYS}")
    print("ok: the questionnaire wrote the DeepSpeed file with Accelerate's keys after re-asking three bad answers")

    # hasten reads it back as the run would: the default file, strategy zero with the answers.
    p = run(hasten("launch", "--dry_run", "prog"), env={"HASTEN_HOME": home}, check=True)
    plan = json.loads(p.stdout.split("resolved config:\n", 1)[1].split("\nworker rank", 1)[0])
    opts = plan["strategy_options"]
    if plan["strategy"] != "zero" or opts.get("stage") != 3 or opts.get("offload_param_device") != "cpu" \
            or plan["mixed_precision"] != "bf16" or plan["num_processes"] != 2:
        fail(f"hasten launch resolved the written file as {plan}")
    print("ok: hasten launch resolves the written file to zero stage 3, param offload, bf16, 2 processes")

    # Never over an existing file without asking: answering no keeps it as it was.
    before = open(path).read()
    t = Terminal(["config"], {"HASTEN_HOME": home})
    t.answer("", "exists. Overwrite it?")
    rc, out, err = t.finish()
    if rc == 0 or open(path).read() != before or "nothing written" not in out:
        fail(f"declining to overwrite: exit {rc}, file changed: {open(path).read() != before}\n{out}")
    print("ok: an existing file is kept when the answer to 'Overwrite it?' is the default no")


def wizard_multi_machine_fsdp(tmp):
    path = os.path.join(tmp, "sub", "fsdp.json")  # .json: written as JSON, as Accelerate does
    t = Terminal(["config", "--config_file", path], {})
    t.answer("1", "compute environment")  # multiple machines
    t.answer("1", "How many machines")
    t.answer("3", "'1' is not allowed (allowed: an integer from 2 to")
    t.answer("5", "rank of this machine")
    t.answer("2", "'5' is not allowed (allowed: an integer from 0 to 2)")
    t.answer("", "IP address")
    t.answer("10.1.2.3", "is not allowed")
    t.answer("", "port")
    text = t.answer("fsdp", "distributed training")
    if "] NO " in text:
        fail(f"NO offered for a run over several machines:\n{text}")
    t.answer("SHARD_GRAD_OP", "fsdp_config.fsdp_sharding_strategy")
    t.answer("maybe", "fsdp_config.fsdp_offload_params")
    t.answer("yes", "'maybe' is not allowed (allowed: yes or no)")
    t.answer("", "fsdp_config.fsdp_backward_prefetch")
    t.answer("yes", "fsdp_config.fsdp_forward_prefetch")
    t.answer("4", "processes in total")
    t.answer("", "'4' is not allowed (allowed: a positive multiple of the 3 machines)")  # default 6
    t.answer("fp16", "Mixed precision")
    t.answer("nosuch", "Trackers")
    t.answer("csv,jsonl", "'nosuch' is not allowed (allowed:")
    rc, out, err = t.finish()
    if rc != 0:
        fail(f"hasten config exited {rc}\nout:\n{out}\nerr:\n{err}")
    with open(path) as f:
        written = json.load(f)
    want = {"distributed_type": "FSDP", "num_machines": 3, "machine_rank": 2, "main_process_ip": "10.1.2.3",
            "main_process_port": 29500, "num_processes": 6, "mixed_precision": "fp16", "trackers": ["csv", "jsonl"],
            "fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_offload_params": True,
                            "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_forward_prefetch": True}}
    got = {k: written.get(k) for k in want}
    if got != want:
        fail(f"the questionnaire wrote\n{written}\nexpected at least\n{want}")
    if set(written["fsdp_config"]) - FSDP_KEYS:
        fail(f"fsdp_config keys Accelerate does not know: {set(written['fsdp_config']) - FSDP_KEYS}")
    print("ok: three machines, FSDP SHARD_GRAD_OP with offload, fp16, csv+jsonl, as JSON, after re-asking five bad answers")
    p = run(hasten("config", "show", "--config_file", path), check=True)
    if f"fsdp_config.fsdp_sharding_strategy\tSHARD_GRAD_OP\tfile {path}" not in p.stdout:
        fail(f"hasten does not read the JSON file the questionnaire wrote:\n{p.stdout}")


def wizard_eof_aborts(tmp):
    path = os.path.join(tmp, "eof.yaml")
    t = Terminal(["config", "--config_file", path], {})
    t.answer("", "compute environment")
    t.eof()
    rc, out, err = t.finish()
    if rc == 0 or os.path.exists(path):
        fail(f"end of input: exit {rc}, file written: {os.path.exists(path)}")
    lines = [l for l in err.splitlines() if l.strip()]
    if len(lines) != 1 or "nothing written" not in lines[0] or "terminate" in err:
        fail(f"end of input should print one line saying nothing was written, got:\n{err}")
    print(f"ok: end of input aborts cleanly: {lines[0]}")


def show_names_origins(tmp):
    path = os.path.join(tmp, "show.yaml")
    with open(path, "w") as f:
        f.write("mixed_precision: bf16\nnum_processes: 4\ngradient_accumulation_steps: 2\n")
    p = run(hasten("config", "show", "--config_file", path, "--set", "gradient_accumulation_steps=8"),
            env={"HASTEN_NUM_PROCESSES": "3"}, check=True)
    rows = {}
    for line in p.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            rows[parts[0]] = (parts[1], parts[2])
    want = {
        "mixed_precision": ("bf16", "file " + path),
        "num_processes": ("3", "env HASTEN_NUM_PROCESSES"),
        "gradient_accumulation_steps": ("8", "flag"),
        "split_batches": ("false", "default"),
        "precision": ("bf16", "derived from mixed_precision"),
        # 3 processes and no strategy named: the workers train data-parallel, and show says so.
        "strategy": ("ddp", "derived from distributed_type"),
    }
    for key, value in want.items():
        if rows.get(key) != value:
            fail(f"config show: {key} is {rows.get(key)}, expected {value}\n{p.stdout}")
    print("ok: config show names a file, an environment variable, a --set flag and a default as origins")
    bad = run(hasten("config", "show", "--set", "num_processes=zero"), env={"HASTEN_HOME": tmp})
    check_clean_failure(bad, "config show with a bad --set", "num_processes")


def dry_run_plan(home, *flags):
    p = run(hasten("launch", "--dry_run", *flags, "prog"), env={"HASTEN_HOME": home})
    if p.returncode != 0:
        return p, None
    return p, json.loads(p.stdout.split("resolved config:\n", 1)[1].split("\nworker rank", 1)[0])


def accelerate_flags(home):
    cases = [
        (["--use_deepspeed", "--zero_stage", "3", "--num_processes", "2"], "zero", {"stage": 3}),
        (["--use_deepspeed", "--num_processes", "2"], "zero", {}),
        (["--use_fsdp", "--fsdp_sharding_strategy", "SHARD_GRAD_OP", "--num_processes", "2"], "fsdp",
         {"sharding_strategy": "SHARD_GRAD_OP"}),
        (["--multi_gpu", "--num_processes", "2"], "ddp", {}),
        (["--cpu"], "single", {}),
        (["--use_deepspeed", "--strategy", "ddp", "--num_processes", "2"], "ddp", {}),
        (["--mixed_precision", "bf16", "--use_fsdp", "--num_processes", "2"], "fsdp", {}),
        (["--use_fsdp", "--num_processes", "2", "--dynamo_backend", "no", "--tee", "3", "--rdzv_backend", "static"],
         "fsdp", {}),
        # Every section key of an installed strategy is a flag under its own name, as Accelerate's
        # launcher takes them (flags derived from the schema, not listed by hand).
        (["--use_deepspeed", "--zero_stage", "3", "--offload_optimizer_device", "cpu", "--offload_param_device", "cpu",
          "--gradient_clipping", "1.0", "--num_processes", "2"], "zero",
         {"stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu", "gradient_clipping": 1.0}),
        (["--use_fsdp", "--fsdp_offload_params", "true", "--fsdp_forward_prefetch", "true",
          "--fsdp-backward-prefetch", "NO_PREFETCH", "--num_processes", "2"], "fsdp",
         {"offload_params": True, "forward_prefetch": True, "backward_prefetch": "NO_PREFETCH"}),
    ]
    for flags, strategy, options in cases:
        p, plan = dry_run_plan(home, *flags)
        if plan is None:
            fail(f"hasten launch --dry_run {' '.join(flags)} exited {p.returncode}: {p.stderr}")
        got = {k: plan["strategy_options"].get(k) for k in options}
        if plan["strategy"] != strategy or got != options:
            fail(f"{' '.join(flags)}: strategy {plan['strategy']} options {plan['strategy_options']}, "
                 f"expected {strategy} with {options}")
        if "--cpu" in flags and plan["use_cpu"] is not True:
            fail(f"--cpu did not set use_cpu: {plan['use_cpu']}")
        if "--mixed_precision" in flags and plan["mixed_precision"] != "bf16":
            fail(f"--mixed_precision bf16 resolved to {plan['mixed_precision']}")
        print(f"ok: hasten launch {' '.join(flags)} selects {strategy} {options}")
    for flags, what, expect in [
        (["--use_deepspeed", "--use_fsdp"], "two paradigm flags", "excludes"),
        (["--cpu", "--multi_gpu"], "--cpu with --multi_gpu", "excludes"),
        (["--use_deepspeed", "--zero_stage", "5", "--num_processes", "2"], "zero stage out of range", "zero_stage"),
        (["--use_fsdp", "--fsdp_sharding_strategy", "HALF", "--num_processes", "2"], "unknown sharding strategy",
         "FULL_SHARD"),
        (["--use_fsdp", "--fsdp_forward_prefetch", "maybe", "--num_processes", "2"], "a bool flag's bad value",
         "fsdp_forward_prefetch"),
        # Accelerate's --tee takes torchrun's stream selector; hasten's logs hold both streams.
        (["--tee", "1"], "--tee 1", "value '1' is not allowed (allowed: 0, no log files, or 3, both streams"),
        # TorchDynamo compiles Python: a backend is refused, not ignored.
        (["--dynamo_backend", "inductor"], "--dynamo_backend inductor",
         "dynamo_config.dynamo_backend (flag): 'inductor' is not supported (allowed: NO)"),
        (["--rdzv_backend", "c10d"], "--rdzv_backend c10d", "rdzv_backend: 'c10d' is not allowed (allowed: static)"),
        (["--megatron_lm_tp_degree", "2"], "a flag of Accelerate's hasten has no meaning for",
         "unknown option '--megatron_lm_tp_degree'"),
    ]:
        p, _ = dry_run_plan(home, *flags)
        check_clean_failure(p, what, expect)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        wizard_writes_deepspeed_file(tmp)
        wizard_multi_machine_fsdp(tmp)
        wizard_eof_aborts(tmp)
        show_names_origins(tmp)
        empty_home = os.path.join(tmp, "empty_home")
        os.makedirs(empty_home)
        accelerate_flags(empty_home)


if __name__ == "__main__":
    main()
