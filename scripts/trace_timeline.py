"""Draws one optimizer step of a Chrome trace that hasten's profiler wrote (config key profile)
as a timeline PNG: the complete events ("ph": "X") of the thread that ran the step, one lane per
nesting depth, hasten's own ranges (hasten::forward, hasten::backward, each collective, ...)
coloured and labelled, LibTorch's operators grey under them. For docs/trackers.md, where a
screenshot of Perfetto or TensorBoard's trace view would need a browser with internet access.

    python scripts/trace_timeline.py TRACE.json OUT.png [--step N]
"""
import argparse
import json
import sys

from PIL import Image, ImageDraw, ImageFont

COLOURS = {
    "hasten::data_wait": (148, 103, 189), "hasten::forward": (31, 119, 180), "hasten::backward": (255, 127, 14),
    "hasten::optimizer_step": (44, 160, 44), "hasten::allreduce": (214, 39, 40), "hasten::allgather": (214, 39, 40),
    "hasten::reduce_scatter": (214, 39, 40), "hasten::broadcast": (214, 39, 40), "hasten::barrier": (214, 39, 40),
    "hasten::wait": (227, 119, 194), "hasten::save_state": (140, 86, 75), "hasten::load_state": (140, 86, 75),
}
WIDTH, LANE, TOP, LEFT = 1400, 22, 46, 10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--step", type=int, default=0, help="which recorded forward to start the picture at")
    a = ap.parse_args()
    with open(a.trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    forwards = sorted((e for e in events if e["name"] == "hasten::forward"), key=lambda e: e["ts"])
    steps = sorted((e for e in events if e["name"] == "hasten::optimizer_step"), key=lambda e: e["ts"])
    if len(forwards) <= a.step:
        sys.exit(f"trace_timeline: {a.trace} has {len(forwards)} hasten::forward ranges; --step {a.step} is not one")
    first = forwards[a.step]
    after = [s for s in steps if s["ts"] >= first["ts"]]
    if not after:
        sys.exit(f"trace_timeline: no hasten::optimizer_step after forward {a.step} in {a.trace}")
    t0, t1 = first["ts"], after[0]["ts"] + after[0]["dur"]
    thread = (first["pid"], first["tid"])
    shown = sorted((e for e in events if (e["pid"], e["tid"]) == thread and e["ts"] >= t0 and e["ts"] + e["dur"] <= t1),
                   key=lambda e: (e["ts"], -e["dur"]))
    # Nesting depth: an event lies inside every open event that ends after it starts.
    open_ends, depth_of = [], []
    for e in shown:
        while open_ends and open_ends[-1] <= e["ts"]:
            open_ends.pop()
        depth_of.append(len(open_ends))
        open_ends.append(e["ts"] + e["dur"])
    lanes = min(max(depth_of, default=0) + 1, 14)
    img = Image.new("RGB", (WIDTH, TOP + lanes * LANE + 40), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    scale = (WIDTH - 2 * LEFT) / max(t1 - t0, 1)
    draw.text((LEFT, 8), f"{a.trace.rsplit('/', 1)[-1]}: one optimizer step, thread {thread[1]}, "
                         f"{(t1 - t0) / 1000:.2f} ms (hasten's ranges in colour, LibTorch's operators grey)",
              fill=(0, 0, 0), font=font)
    for e, depth in zip(shown, depth_of):
        if depth >= lanes:
            continue
        x0 = LEFT + (e["ts"] - t0) * scale
        x1 = max(x0 + 1, LEFT + (e["ts"] + e["dur"] - t0) * scale)
        y0 = TOP + depth * LANE
        colour = COLOURS.get(e["name"], (200, 200, 200))
        draw.rectangle([x0, y0, x1, y0 + LANE - 3], fill=colour, outline=(90, 90, 90))
        label = e["name"].removeprefix("hasten::") if e["name"] in COLOURS else e["name"].removeprefix("aten::")
        if draw.textlength(label, font=font) < x1 - x0 - 4:
            draw.text((x0 + 2, y0 + 5), label, fill=(0, 0, 0) if e["name"] not in COLOURS else (255, 255, 255), font=font)
    ms = 0.0
    step_ms = max(0.5, round((t1 - t0) / 1000 / 10, 1))
    while ms * 1000 <= t1 - t0:
        x = LEFT + ms * 1000 * scale
        draw.line([x, TOP + lanes * LANE + 4, x, TOP + lanes * LANE + 10], fill=(0, 0, 0))
        draw.text((x + 2, TOP + lanes * LANE + 12), f"{ms:g} ms", fill=(0, 0, 0), font=font)
        ms += step_ms
    img.save(a.out)
    print(f"trace_timeline: {len(shown)} events of one step ({(t1 - t0) / 1000:.2f} ms) -> {a.out}")


if __name__ == "__main__":
    main()
