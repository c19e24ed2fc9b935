"""Compiles the examples in the SDK headers' comments (between "example begin" and "example
end" markers), so that what the headers teach stays true to the headers: those of the C++
and ABI headers as C++17, those of the plain-C helpers as strict C99.
Usage: header_examples.py CXX SDK_INCLUDE DLPACK_INCLUDE CC"""
import os
import re
import subprocess
import sys
import tempfile

cxx, sdk, dlpack, cc = sys.argv[1:5]
languages = {
    "plugin.hpp": (cxx, ".cpp", ["-std=c++17"]),
    "plugin.h": (cxx, ".cpp", ["-std=c++17"]),
    "plugin_error.h": (cc, ".c", ["-std=c99", "-pedantic"]),
    "plugin_options.h": (cc, ".c", ["-std=c99", "-pedantic"]),
}
found = 0
for header, (compiler, suffix, flags) in languages.items():
    text = open(os.path.join(sdk, "hasten", header)).read()
    blocks = re.findall(r"example begin\n(.*?)\n[ */]*example end", text, re.S)
    if not blocks and suffix == ".c":
        sys.exit(f"FAIL: no example found in {header}")
    for block in blocks:
        found += 1
        code = "\n".join(re.sub(r"^\s*(//|\*)\s?  ", "", line) for line in block.splitlines()) + "\n"
        with tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False) as f:
            f.write(code)
        p = subprocess.run([compiler, *flags, "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I", sdk, "-I",
                            dlpack, f.name], capture_output=True, text=True)
        os.unlink(f.name)
        if p.returncode != 0:
            sys.exit(f"FAIL: the example in {header} does not compile:\n{code}\n{p.stderr}")
if found == 0:
    sys.exit("FAIL: no example found in the SDK headers")
print(f"{found} header example(s) compile")
