"""safetensors between hasten and numpy, both ways. The .venv Python with numpy reads the
model.safetensors hasten saves (with the small reader below, not the safetensors package) and
finds the dtypes, shapes and values, bit for bit, that the C++ side reports it saved; hasten reads
a file numpy wrote, laid out unlike hasten's own, and reports the values numpy put in it; and a
file with overlapping tensors is refused in one clear line."""
import json
import os
import struct
import tempfile

import numpy as np

import harness as h

PROGRAM = os.path.join(os.environ["HASTEN_TEST_WORKER_DIR"], "hasten-test-safetensors")
NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1",
         "BOOL": "?"}


def read_safetensors(path):
    """The format read with numpy alone: (metadata, {name: (dtype code, array)}), after checking
    that the data starts 8-byte aligned and that the tensors tile the data region."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    if (8 + n) % 8:
        h.fail(f"{path}: the data starts at byte {8 + n}, not 8-byte aligned")
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    spans = sorted(tuple(e["data_offsets"]) for e in header.values())
    end = 0
    for begin, stop in spans:
        if begin != end:
            h.fail(f"{path}: the tensors do not tile the data: {spans}")
        end = stop
    if end != len(data):
        h.fail(f"{path}: the tensors cover {end} of {len(data)} data bytes")
    tensors = {}
    for name, e in header.items():
        begin, stop = e["data_offsets"]
        raw = data[begin:stop]
        if e["dtype"] == "BF16":  # numpy has no bfloat16: its bits are the upper half of a float32's
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, NUMPY[e["dtype"]])
        tensors[name] = (e["dtype"], a.reshape(e["shape"]))
    return metadata, tensors


def write_safetensors(path, tensors, metadata):
    """tensors: {name: (dtype code, shape, raw bytes)}. Another writer's layout: the header lists the tensors in the reverse of their data order
    and is not padded, so the data starts unaligned."""
    header, data = {}, b""
    for name, (code, shape, raw) in tensors.items():
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps({"__metadata__": metadata, **dict(reversed(list(header.items())))}).encode()
    if (8 + len(text)) % 8 == 0:
        text += b" "
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def same(x, y):
    """Equal bit for bit as doubles (-0.0 is not 0.0), or equal as ints and bools."""
    if isinstance(x, float) or isinstance(y, float):
        return struct.pack("<d", float(x)) == struct.pack("<d", float(y))
    return type(x) is type(y) and x == y


def python_values(code, a):
    flat = a.ravel()
    if code in ("F64", "F32", "F16", "BF16"):
        return [float(v) for v in flat]
    if code == "BOOL":
        return [bool(v) for v in flat]
    return [int(v) for v in flat]


def compare(what, reported, tensors):
    if sorted(r["name"] for r in reported) != sorted(tensors):
        h.fail(f"{what}: names differ: C++ {sorted(r['name'] for r in reported)}, numpy {sorted(tensors)}")
    for r in reported:
        code, a = tensors[r["name"]]
        if r["dtype"] != code or r["shape"] != list(a.shape):
            h.fail(f"{what}: {r['name']}: C++ {r['dtype']} {r['shape']}, numpy {code} {list(a.shape)}")
        mine = python_values(code, a)
        if len(mine) != len(r["values"]) or not all(same(x, y) for x, y in zip(r["values"], mine)):
            h.fail(f"{what}: {r['name']} ({code}): C++ {r['values']}, numpy {mine}")


with tempfile.TemporaryDirectory() as tmp:
    # hasten writes, numpy reads.
    model = os.path.join(tmp, "model.safetensors")
    reported = json.loads(h.run([PROGRAM, "write", model], check=True).stdout)
    metadata, tensors = read_safetensors(model)
    if metadata != {"format": "pt"}:
        h.fail(f"model.safetensors: metadata {metadata}")
    codes = {r["dtype"] for r in reported}
    if codes != set(NUMPY) | {"BF16"}:
        h.fail(f"the model's state should hold every dtype, holds {sorted(codes)}")
    compare("hasten -> numpy", reported, tensors)
    print(f"ok: numpy reads the {len(tensors)} tensors hasten saved ({', '.join(sorted(codes))}) bit for bit")

    # numpy writes, hasten reads.
    rng = np.random.default_rng(3)
    bf16 = np.array([1.5, -2.0, 0.15625, -0.0], np.float32)  # exact in bfloat16: its bits are the upper half
    written = {
        "f64": ("F64", np.array([[-0.0, 2.5e-320], [1e300, -1 / 3]], "<f8")),
        "f32": ("F32", rng.standard_normal((3, 2)).astype("<f4")),
        "f16": ("F16", np.array([65504, -0.0, 6e-8, 0.1], "<f2")),
        "bf16": ("BF16", bf16),
        "i64": ("I64", np.array([-2**63, 2**63 - 1, 2**53 + 1], "<i8")),
        "i32": ("I32", np.array([-2**31, 2**31 - 1], "<i4")),
        "i16": ("I16", np.array([[-32768], [32767]], "<i2")),
        "i8": ("I8", np.array([-128, 127, 0], "i1")),
        "u8": ("U8", np.arange(0, 256, 51, dtype="u1")),
        "bool": ("BOOL", np.array([True, False, True])),
        "scalar": ("F32", np.array(4.25, "<f4")),
        "empty": ("I32", np.zeros((0, 5), "<i4")),
    }
    raw = {name: (code, list(a.shape), (a.view(np.uint32) >> 16).astype("<u2").tobytes() if code == "BF16" else a.tobytes())
           for name, (code, a) in written.items()}
    other = os.path.join(tmp, "numpy.safetensors")
    write_safetensors(other, raw, {"writer": "numpy"})
    compare("numpy -> hasten", json.loads(h.run([PROGRAM, "read", other], check=True).stdout), written)
    print(f"ok: hasten reads the {len(written)} tensors numpy wrote")

    # A malformed file: one clear line, no crash.
    bad = os.path.join(tmp, "overlap.safetensors")
    text = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()
    with open(bad, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(12))
    h.check_clean_failure(h.run([PROGRAM, "read", bad]), "overlapping tensors",
                          "tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a' (data_offsets [0, 8])")
