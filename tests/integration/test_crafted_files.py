"""Readers that cannot be walked off the end: crafted checkpoint manifests, state files and
weights indexes (sizes that wrap, chunk sizes that would allocate without bound, missing or
mistyped keys, file names that leave the directory) each end the program with one line and
no signal; the crafted cases of the security review are kept here as regression tests."""
import json
import os
import shutil
import tempfile

import harness as h

WORKER = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-worker")


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def load(ckpt):
    return h.run([WORKER, "--steps", "0", "--load", ckpt], timeout=120)


with tempfile.TemporaryDirectory() as d:
    good = os.path.join(d, "good")
    p = h.run([WORKER, "--steps", "2", "--save", good], timeout=120)
    if p.returncode != 0:
        h.fail(f"saving the checkpoint to craft from failed:\n{p.stderr}")
    if load(good).returncode != 0:
        h.fail("the unmodified checkpoint does not load")
    with open(os.path.join(good, "manifest.json")) as f:
        manifest = json.load(f)
    model = next(n for n in manifest["files"] if n.startswith("model"))
    with open(os.path.join(good, "hasten_state.json"), "rb") as f:
        state_bytes = f.read()
    state = json.loads(state_bytes)

    def crafted(name, edit_manifest=None, edit_state=None):
        ckpt = os.path.join(d, name)
        shutil.copytree(good, ckpt)
        m = json.loads(json.dumps(manifest))
        if edit_state:
            st = json.loads(json.dumps(state))
            edit_state(st)
            data = json.dumps(st).encode()
            with open(os.path.join(ckpt, "hasten_state.json"), "wb") as f:
                f.write(data)
            # The file's size and checksum made to match: only its content is wrong.
            m["files"]["hasten_state.json"]["size"] = len(data)
            m["files"]["hasten_state.json"]["crc32c"] = f"{crc32c(data):08x}"
        if edit_manifest:
            edit_manifest(m)
        with open(os.path.join(ckpt, "manifest.json"), "w") as f:
            json.dump(m, f)
        return ckpt

    def setter(*path_and_value):
        *path, value = path_and_value

        def edit(doc):
            for k in path[:-1]:
                doc = doc[k]
            if value is DELETE:
                del doc[path[-1]]
            else:
                doc[path[-1]] = value
        return edit

    DELETE = object()
    size = manifest["files"][model]["size"]
    cases = [
        ("chunk size that wraps the chunk count", setter("files", model, "chunk_size", 2**64 - 1), None, "chunk_size"),
        ("chunk size beyond the bound", setter("files", model, "chunk_size", 2**40), None, "chunk_size"),
        ("chunk size zero", setter("files", model, "chunk_size", 0), None, "chunk_size"),
        ("chunk count that does not match", setter("files", model, "chunks", []), None, "chunk checksums"),
        ("a size as text", setter("files", model, "size", str(size)), None, "unsigned size"),
        ("a size beyond 2^50", setter("files", model, "size", 2**60), None, "2^50"),
        ("a negative size", setter("files", model, "size", -1), None, "unsigned size"),
        ("a file name that leaves the directory", lambda m: m["files"].update({"../outside": m["files"][model]}),
         None, "not a plain file name"),
        ("an absolute file name", lambda m: m["files"].update({"/etc/passwd": m["files"][model]}), None,
         "not a plain file name"),
        ("files that is not an object", setter("files", []), None, "malformed"),
        # save_on_each_node's machine copies list their ranks: only ranks below world_size, ascending.
        ("ranks that is not a list", setter("ranks", "0"), None, "'ranks' must list ranks below its world_size"),
        ("ranks beyond the world size", setter("ranks", [0, 1]), None, "'ranks' must list ranks below its world_size"),
        ("an empty ranks list", setter("ranks", []), None, "'ranks' must list ranks below its world_size"),
        ("no optimizers in the state", None, setter("optimizers", DELETE), "optimizers must be an object"),
        ("optimizer layouts shorter than the count", None, setter("optimizers", "layouts", []),
         "optimizers.layouts must be an array of optimizers.count entries"),
        ("world_size zero", None, setter("world_size", 0), "world_size must be an integer"),
        ("schedulers as an object", None, setter("schedulers", {}), "schedulers must be an array"),
        ("no accumulation", None, setter("accumulation", DELETE), "accumulation must be an object"),
        ("a custom entry of another kind", None, setter("custom", ["pickle"]), "custom[] must be"),
        ("the state not an object", None, lambda st: st.clear() or None, "world_size"),
    ]
    for what, edit_manifest, edit_state, expect in cases:
        ckpt = crafted(what.replace(" ", "_").replace("/", "_"), edit_manifest, edit_state)
        h.check_clean_failure(load(ckpt), f"a checkpoint with {what}", expect)

# A weights index whose weight_map leaves the directory.
with tempfile.TemporaryDirectory() as d:
    weights = os.path.join(d, "weights")
    os.makedirs(weights)
    for target in ("../secret.safetensors", "/etc/passwd", "..", ""):
        with open(os.path.join(weights, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": {"w": target}}, f)
        h.check_clean_failure(h.run(h.hasten("merge-weights", weights, os.path.join(d, "out.safetensors"))),
                              f"a weights index mapping a tensor to {target!r}", "allowed: the name of a file beside the index")
print("crafted files: OK")
