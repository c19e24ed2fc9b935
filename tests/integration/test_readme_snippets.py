"""README's C++ snippets compile, with the C++ standard README states, against the headers a user
includes: each ```cpp block of README.md, after the few declarations it leaves to the reader
(CONTEXT below: a block without an entry fails, so a new snippet cannot go untested), compiled with
the project's own command for prepare_errors.cpp (compile_commands.json) and -std=c++NN."""
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from compile_command import command_for

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
README = os.path.join(ROOT, "README.md")
REFERENCE = os.path.join(HERE, "prepare_errors.cpp")

PRELUDE = """#include <hasten/hasten.hpp>
#include <torch/torch.h>
#include <memory>
#include <string>
struct Net : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  Net() { fc = register_module("fc", torch::nn::Linear(4, 2)); }
  torch::Tensor forward(torch::Tensor x) { return fc->forward(x); }
};
"""

# What each block (by its first line that is not an #include) needs around it: "program" blocks
# are whole translation units after the prelude's declarations; "body" blocks are statements,
# placed in a function with the names they use.
CONTEXT = {
    "int main() {": ("program", "torch::Tensor inputs = torch::randn({8, 4}), targets = torch::randint(2, {8});\n"),
    "using namespace torch::data;": ("body", "void snippet(hasten::Accelerator& acc, hasten::PreparedModel<std::shared_ptr<Net>>& model, const std::string& dir) {\n"),
}


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


text = open(README).read()
stated = re.search(r"\*\*C\+\+(\d\d)\b", text)
if not stated:
    fail("README.md states no C++ standard (a '**C++NN' requirement line)")
std = stated.group(1)
blocks = re.findall(r"```cpp\n(.*?)```", text, re.S)
if not blocks:
    fail("README.md has no ```cpp block")

units = []
for block in blocks:
    key = next(l.strip() for l in block.splitlines() if l.strip() and not l.startswith("#include"))
    if key not in CONTEXT:
        fail(f"README.md has a C++ block starting {key!r} that this test does not know: add its context to CONTEXT")
    kind, context = CONTEXT[key]
    if kind == "program":
        units.append(PRELUDE + context + block)
    else:
        units.append(PRELUDE + context + block + "}\n")

args, directory = command_for(REFERENCE)


def compile_unit(index_unit):
    index, unit = index_unit
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, f"readme_{index}.cpp")
        with open(src, "w") as f:
            f.write(unit)
        a = [src if os.path.realpath(x) == os.path.realpath(REFERENCE) else x for x in args]
        i = a.index("-o")
        a[i + 1] = os.path.join(tmp, f"readme_{index}.o")
        a = [x for x in a if not x.startswith("-std=")]
        a.insert(1, f"-std=c++{std}")
        env = dict(os.environ, LC_ALL="C", LANG="C")
        p = subprocess.run(a, cwd=directory, capture_output=True, text=True, timeout=600, env=env)
        return p.returncode, p.stdout + p.stderr


with ThreadPoolExecutor(max_workers=2) as pool:
    results = list(pool.map(compile_unit, enumerate(units)))
for i, (rc, output) in enumerate(results):
    if rc != 0:
        print(units[i])
        fail(f"README.md's C++ block {i + 1} does not compile with -std=c++{std}:\n{output[:4000]}")
print(f"README.md's {len(units)} C++ blocks compile with -std=c++{std}")
