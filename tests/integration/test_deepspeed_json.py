"""DeepSpeed JSON configs, read by the zero strategy's reader: as the config file of hasten
launch and through deepspeed_config.deepspeed_config_file they select the same strategy and
options as the equivalent YAML and train to the same losses; keys hasten does not implement are
named in one warning; "auto" leaves a value to the run; an optimizer section, a static loss
scale and a key set differently in the YAML are clean errors."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check_clean_failure, fail, hasten, run  # noqa: E402

EXAMPLE = os.path.join(os.environ["HASTEN_TEST_BIN_DIR"], "hasten-example")
PROGRAM = [EXAMPLE, "--workload", "mlp-small", "--warmup", "0", "--steps", "8", "--log-every", "0", "--json"]

YAML = """distributed_type: DEEPSPEED
mixed_precision: bf16
gradient_accumulation_steps: 2
deepspeed_config:
  zero_stage: 3
  offload_optimizer_device: cpu
  gradient_clipping: 0.5
"""
DEEPSPEED = {
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "overlap_comm": True},
    "gradient_clipping": 0.5,
    "gradient_accumulation_steps": 2,
    "bf16": {"enabled": True},
    "train_micro_batch_size_per_gpu": "auto",
    "steps_per_print": 100,
}
NOT_IMPLEMENTED = ["zero_optimization.offload_optimizer.pin_memory", "zero_optimization.overlap_comm", "steps_per_print"]


def write(tmp, name, content):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(content if isinstance(content, str) else json.dumps(content))
    return path


def plan(env, *flags):
    p = run(hasten("launch", "--dry_run", *flags, "prog"), env=env)
    if p.returncode != 0:
        fail(f"hasten launch --dry_run {' '.join(flags)} exited {p.returncode}: {p.stderr}")
    resolved = json.loads(p.stdout.split("resolved config:\n", 1)[1].split("\nworker rank", 1)[0])
    return resolved, p.stderr


def selection(resolved):
    return {k: resolved[k] for k in ("strategy", "strategy_options", "mixed_precision", "precision",
                                    "gradient_accumulation_steps")}


def train(tmp, env, tag, config):
    out = os.path.join(tmp, tag + ".json")
    p = run(hasten("launch", "--num_processes", "2", "--config_file", config, *PROGRAM, "--losses-out", out),
            env=env, check=True, timeout=600)
    with open(out) as f:
        losses = json.load(f)["losses"]
    line = [l for l in p.stdout.splitlines() if '"impl"' in l][0]
    summary = json.loads(line[line.index("{"):])
    return losses, summary, p.stderr


def main():
    with tempfile.TemporaryDirectory() as tmp:
        env = {"HASTEN_HOME": os.path.join(tmp, "home")}
        yaml_file = write(tmp, "zero3.yaml", YAML)
        ds_file = write(tmp, "ds_zero3.json", DEEPSPEED)

        # Same selection from the YAML, the JSON as the config file, and a YAML naming the JSON.
        from_yaml, _ = plan(env, "--config_file", yaml_file)
        from_json, err = plan(env, "--config_file", ds_file)
        named = write(tmp, "named.yaml", f"distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                                         f"  deepspeed_config_file: {ds_file}\n")
        from_named, _ = plan(env, "--config_file", named)
        want = selection(from_yaml)
        if want["strategy"] != "zero" or want["strategy_options"].get("stage") != 3:
            fail(f"the YAML itself resolved to {want}")
        for what, got in (("DeepSpeed JSON as --config_file", from_json), ("deepspeed_config_file", from_named)):
            if selection(got) != want:
                fail(f"{what} resolved to {selection(got)}, the YAML to {want}")
            print(f"ok: {what} selects {want}")
        warnings = [l for l in err.splitlines() if "not implemented" in l]
        if len(warnings) != 1 or not all(k in warnings[0] for k in NOT_IMPLEMENTED):
            fail(f"expected one warning naming {NOT_IMPLEMENTED}, got:\n{err}")
        if "gradient_clipping" in warnings[0] or "train_micro_batch_size_per_gpu" in warnings[0]:
            fail(f"implemented or 'auto' keys named as not implemented: {warnings[0]}")
        print(f"ok: one warning: {warnings[0]}")

        # Same losses, training for real on 2 processes.
        l_yaml, s_yaml, _ = train(tmp, env, "yaml", yaml_file)
        l_json, s_json, err = train(tmp, env, "json", ds_file)
        if l_yaml != l_json:
            fail(f"losses differ: YAML {l_yaml} vs DeepSpeed JSON {l_json}")
        # The run's own words: strategy, world size, accumulation and precision it trained with.
        if s_json["mode"] != s_yaml["mode"] or s_json["mode"] != "zero-w2-accum2-bf16":
            fail(f"mode: YAML run {s_yaml['mode']}, JSON run {s_json['mode']} (expected zero-w2-accum2-bf16)")
        if sum("not implemented" in l for l in err.splitlines()) != 1:
            fail(f"the warning should come once (from the launcher, not from every worker):\n{err}")
        print(f"ok: the same {len(l_json)} losses both ways (last {l_json[-1]:.6f}), bf16, accumulation 2")

        # "auto": the run decides (here a flag and the defaults); fp16's loss scaling.
        auto = write(tmp, "auto.json", {"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"},
                                        "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
                                        "train_batch_size": "auto"})
        got, err = plan(env, "--config_file", auto, "--mixed_precision", "bf16")
        if got["mixed_precision"] != "bf16" or got["gradient_accumulation_steps"] != 1 \
                or got["strategy_options"] != {"stage": 2} or "not implemented" in err:
            fail(f"'auto' values: {selection(got)}\n{err}")
        print("ok: \"auto\" values are left to the run")
        fp16 = write(tmp, "fp16.json", {"zero_optimization": {"stage": 1},
                                        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 10,
                                                 "loss_scale_window": 100, "hysteresis": 2}})
        got, err = plan(env, "--config_file", fp16)
        if got["mixed_precision"] != "fp16" or got["precision_options"] != {"init_scale": 1024.0, "growth_interval": 100}:
            fail(f"fp16 loss scaling: {got['mixed_precision']} {got['precision_options']}")
        if "fp16.hysteresis" not in err:
            fail(f"fp16.hysteresis not named in a warning:\n{err}")
        print("ok: fp16 with initial_scale_power 10 and loss_scale_window 100 -> init_scale 1024, growth_interval 100")

        # config show says where the values came from.
        p = run(hasten("config", "show", "--config_file", ds_file), env=env, check=True)
        if f"deepspeed_config.zero_stage\t3\tDeepSpeed JSON file {ds_file}" not in p.stdout:
            fail(f"config show does not name the DeepSpeed JSON as the origin:\n{p.stdout}")
        print("ok: config show names the DeepSpeed JSON file as the origin")

        # Errors: what ignoring would change, a key set twice differently, a file that is not one.
        cases = [
            ("an optimizer section", {"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}}, "optimizer"),
            ("a static loss scale", {"fp16": {"enabled": True, "loss_scale": 128}}, "fp16.loss_scale"),
            ("bf16 and fp16 both enabled", {"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "fp16.enabled"),
            ("stage 5", {"zero_optimization": {"stage": 5}}, "zero_stage"),
        ]
        for what, content, expect in cases:
            check_clean_failure(run(hasten("launch", "--dry_run", "--config_file", write(tmp, "bad.json", content),
                                           "prog"), env=env), what, expect)
        bf16_file = write(tmp, "bf16.json", {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})
        clash = write(tmp, "clash.yaml", f"mixed_precision: fp16\ndeepspeed_config:\n  deepspeed_config_file: {bf16_file}\n")
        check_clean_failure(run(hasten("launch", "--dry_run", "--config_file", clash, "prog"), env=env),
                            "mixed_precision fp16 in the YAML, bf16 in its DeepSpeed JSON", "mixed_precision")
        not_ds = write(tmp, "plain.json", {"hello": 1})
        named_bad = write(tmp, "named_bad.yaml", f"deepspeed_config:\n  deepspeed_config_file: {not_ds}\n")
        check_clean_failure(run(hasten("launch", "--dry_run", "--config_file", named_bad, "prog"), env=env),
                            "deepspeed_config_file naming a file that is not DeepSpeed's", "not a DeepSpeed JSON")


if __name__ == "__main__":
    main()
