"""Compiles the examples in the SDK headers' comments (between "example begin" and "example
end" markers), so that what the headers teach stays true to the headers.
Usage: header_examples.py CXX SDK_INCLUDE DLPACK_INCLUDE"""
import os
import re
import subprocess
import sys
import tempfile

cxx, sdk, dlpack = sys.argv[1:4]
found = 0
for header in ("plugin.hpp", "plugin.h"):
    text = open(os.path.join(sdk, "hasten", header)).read()
    for block in re.findall(r"example begin\n(.*?)\n[ */]*example end", text, re.S):
        found += 1
        code = "\n".join(re.sub(r"^\s*(//|\*)\s?  ", "", line) for line in block.splitlines()) + "\n"
        with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as f:
            f.write(code)
        p = subprocess.run([cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I", sdk, "-I",
                            dlpack, f.name], capture_output=True, text=True)
        os.unlink(f.name)
        if p.returncode != 0:
            sys.exit(f"FAIL: the example in {header} does not compile:\n{code}\n{p.stderr}")
if found == 0:
    sys.exit("FAIL: no example found in the SDK headers")
print(f"{found} header example(s) compile")
