"""Bad values that were silently accepted or crashed (issue 11, items 1, 11 and 12): each is a
non-zero exit with one error line naming the value and what is allowed, never a default put in
its place, a crash or a C++ exception's own text."""
import os
import tempfile

import harness as h


def bench(*args):
    return [os.path.join(h.BIN, "hasten-bench"), *args]


with tempfile.TemporaryDirectory() as d:
    env = {"HASTEN_HOME": os.path.join(d, "home")}
    marker = os.path.join(d, "a-worker-started")
    recursive = os.path.join(d, "recursive.yaml")
    with open(recursive, "w") as f:
        f.write("a: &a [*a]\n")
    laughs = os.path.join(d, "laughs.yaml")
    with open(laughs, "w") as f:
        f.write("l0: &l0 [x, x, x, x, x, x, x, x, x]\n")
        for i in range(1, 10):
            f.write(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n")
    duplicate = os.path.join(d, "duplicate.yaml")
    with open(duplicate, "w") as f:
        f.write("mixed_precision: bf16\nnum_processes: 1\nmixed_precision: 'no'\n")
    single_four = os.path.join(d, "no-four.yaml")
    with open(single_four, "w") as f:
        f.write("distributed_type: 'NO'\nnum_processes: 4\n")
    quick = ("--warmup", "0")

    cases = [
        # item 11: numeric flags
        (h.example("--steps", "-5", *quick), "example --steps -5", "value '-5' is not allowed (allowed: an integer from 0 to"),
        (h.example("--steps", "99999999999", *quick), "example --steps 99999999999", "value '99999999999' is not allowed"),
        (h.example("--batch", "0", *quick), "example --batch 0", "value '0' is not allowed (allowed: an integer from 1 to"),
        (h.example("--gradient_accumulation_steps", "0", *quick), "example --gradient_accumulation_steps 0",
         "value '0' is not allowed"),
        (h.example("--clip", "-1", *quick), "example --clip -1", "value '-1' is not allowed (allowed: a finite number from 0"),
        (h.example("--clip", "nan", *quick), "example --clip nan", "value 'nan' is not allowed"),
        (bench("--steps", "-5"), "bench --steps -5", "value '-5' is not allowed"),
        (bench("--collectives", "--max-bytes", "-1"), "bench --max-bytes -1", "value '-1' is not allowed (allowed: an integer from 4096"),
        (h.hasten("launch", "--grace_period", "nan", "sh", "-c", f"touch {marker}"), "launch --grace_period nan",
         "value 'nan' is not allowed (allowed: a finite number"),
        # item 1: recursive aliases and expansion in every source
        (h.hasten("env", "--config_file", recursive), "a recursive alias in a file", "nests deeper than 64 levels"),
        (h.hasten("env", "--config_file", laughs), "nested aliases in a file", "holds more than 100000 values"),
        (h.hasten("launch", "--set", "strategy_options=&a {x: *a}", "sh", "-c", f"touch {marker}"),
         "a recursive alias in --set", "command-line flags (strategy_options): nests deeper than 64 levels"),
        # item 12: contradictions, bounds, duplicates
        (h.hasten("launch", "--dry-run", "--config_file", single_four, "prog"), "distributed_type NO with 4 processes",
         "distributed_type NO (file"),
        (h.hasten("launch", "--set", "timeout_s=1e300", "sh", "-c", f"touch {marker}"), "timeout_s 1e300",
         "timeout_s: 1e+300 is out of range (allowed: 0.001 to 31536000)"),
        (h.hasten("env", "--config_file", duplicate), "a duplicate key", "the key 'mixed_precision' appears twice"),
        # issue 29: strategy options that were accepted and did nothing are refused with one line
        (h.example("--strategy", "ddp", "--set", "strategy_options={static_graph: true}", *quick), "ddp static_graph",
         "ddp options: static_graph: true is not supported (hasten's ddp has no static-graph mode; allowed: false)"),
        (h.example("--strategy", "ddp", "--set", "strategy_options={check_reduction: true}", *quick),
         "ddp check_reduction", "ddp options: check_reduction: true is not supported"),
    ]
    dynamo = os.path.join(d, "dynamo.yaml")
    with open(dynamo, "w") as f:
        f.write("dynamo_config:\n  dynamo_backend: INDUCTOR\n")
    cases.append((h.hasten("env", "--config_file", dynamo), "a dynamo backend in a config file",
                  f"dynamo_config.dynamo_backend (file {dynamo}): 'INDUCTOR' is not supported (allowed: NO)"))
    zero3 = ("--set", "distributed_type=DEEPSPEED", "--set", "deepspeed_config.zero_stage=3")
    for key, value, expect in [
        ("offload_optimizer_nvme_path", "/nvme", "nvme offload is not supported; allowed: none"),
        ("offload_param_nvme_path", "/nvme", "nvme offload is not supported; allowed: none"),
        ("deepspeed_moe_layer_cls_names", "MixtralSparseMoeBlock", "it names Python MoE classes"),
        ("deepspeed_multinode_launcher", "pdsh", "hasten launch runs on each machine, as Accelerate's standard launcher does; allowed: standard"),
        ("deepspeed_hostfile", "/etc/hosts", "hasten launch starts the processes of one machine; give each machine's --machine_rank and --main_process_ip; allowed: none"),
        ("deepspeed_inclusion_filter", "a", "hasten has no hostfile to filter; allowed: none"),
        ("deepspeed_exclusion_filter", "b", "hasten has no hostfile to filter; allowed: none"),
    ]:
        cases.append((h.example(*zero3, "--set", f"deepspeed_config.{key}={value}", *quick), f"zero {key}",
                      f"zero options: {key}: '{value}' is not supported ({expect}"))
    for cmd, what, expect in cases:
        h.check_clean_failure(h.run(cmd, env=env), what, expect)

    env_cases = [
        ({"HASTEN_STRATEGY_OPTIONS": "&a {x: *a}"}, "a recursive alias in a HASTEN_ variable",
         "environment HASTEN_STRATEGY_OPTIONS: nests deeper than 64 levels"),
        ({"HASTEN_CONFIG_JSON": '{"commands": ' + "[" * 65000 + "]" * 65000 + "}"}, "HASTEN_CONFIG_JSON nested 65000 deep",
         "environment HASTEN_CONFIG_JSON: nests deeper than 64 levels"),
        ({"HASTEN_TRACKERS": "[csv"}, "HASTEN_TRACKERS='[csv'", "environment HASTEN_TRACKERS: malformed YAML value '[csv'"),
    ]
    for extra, what, expect in env_cases:
        h.check_clean_failure(h.run(h.example("--steps", "1", *quick), env={**env, **extra}), what, expect)
    if os.path.exists(marker):
        h.fail("a worker started although the launcher should have refused the run")
print("bad values: OK")
