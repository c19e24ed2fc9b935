"""The installed headers are for users and plugin authors only: no core/src header is installed (none is the same file),
none includes one, and none names a type that core/src's internal headers declare (the engine's
state stays behind detail::Engine's pimpl). Usage: installed_headers.py PREFIX SOURCE_DIR."""
import os
import re
import sys

prefix, source = sys.argv[1], sys.argv[2]
include = os.path.join(prefix, "include")
internal_dir = os.path.join(source, "core", "src")
public_dir = os.path.join(source, "core", "include")

DECL = re.compile(r"^\s*(?:class|struct|enum class|enum)\s+(?:\[\[\w+\]\]\s+)?([A-Z]\w*)\b(?!\s*;)", re.M)


def headers(root):
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith((".h", ".hpp")):
                yield os.path.join(dirpath, f)


internal_texts = {open(p, encoding="utf-8").read(): os.path.relpath(p, source) for p in headers(internal_dir)}
internal_types = set()
for p in headers(internal_dir):
    internal_types.update(DECL.findall(open(p, encoding="utf-8").read()))
# Names a public header declares too (a pimpl's `struct Impl;`, a public type an internal one
# wraps) are not internal names.
public_types = set()
for p in headers(public_dir):
    public_types.update(re.findall(r"\b(?:class|struct)\s+([A-Z]\w*)", open(p, encoding="utf-8").read()))
internal_types -= public_types
if len(internal_types) < 10:
    sys.exit(f"FAIL: found only {sorted(internal_types)} as internal type names in {internal_dir}: the pattern is stale")

problems = []
installed = list(headers(include))
if not installed:
    sys.exit(f"FAIL: no headers under {include}")
for p in installed:
    name = os.path.relpath(p, include)
    text = open(p, encoding="utf-8").read()
    if text in internal_texts:
        problems.append(f"{name}: is the internal header {internal_texts[text]}")
    for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
        problems.append(f"{name}: includes \"{inc}\" (installed headers include <hasten/...> only)")
    code = re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", text), flags=re.S)
    for t in sorted(internal_types):
        if re.search(rf"\b{t}\b", code):
            problems.append(f"{name}: names the internal type {t}")
if problems:
    sys.exit("FAIL: installed headers expose internals:\n  " + "\n  ".join(problems))
print(f"{len(installed)} installed headers, none names one of {len(internal_types)} internal types or includes an internal header")
