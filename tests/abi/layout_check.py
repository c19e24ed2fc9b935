"""The ABI's struct layouts, frozen per minor: every field of every struct in the SDK's C
headers (plugin.h, plugin_options.h, plugin_config_file.h) keeps the offset it had in each
minor it existed in (fields are only ever appended), no struct shrinks, and the current minor's
table (tests/abi/layouts/1.N.txt) is exactly the headers' layout, so a field appended without a
new minor fails too. The offsets come from the C compiler (offsetof, sizeof), not from reading.

  layout_check.py CC SDK_INCLUDE DLPACK_INCLUDE LAYOUTS          check the headers
  layout_check.py ... --write                                     (re)write the current minor's table
  layout_check.py ... --show-a-moved-field                        move a field in a copy of plugin.h
                                                                  and show that the check fails
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HEADERS = ("plugin.h", "plugin_options.h", "plugin_config_file.h")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def structs(text):
    """[(struct name, [field names in order])] of every struct defined in a header's text."""
    text = strip_comments(text)
    text = re.sub(r"^\s*#.*$", " ", text, flags=re.M)  # preprocessor lines
    out = []
    for m in re.finditer(r"\bstruct\s+(\w+)\s*\{", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        body = text[m.end():i - 1]
        fields, decl, paren = [], "", 0
        for ch in body:
            paren += {"(": 1, ")": -1}.get(ch, 0)
            if ch == ";" and paren == 0:
                fields.extend(field_names(decl))
                decl = ""
            else:
                decl += ch
        out.append((m.group(1), fields))
    return out


def field_names(decl):
    decl = " ".join(decl.split())
    if not decl:
        return []
    if decl == "HASTEN_STRUCT_HEADER":
        return ["struct_size", "abi_version"]
    pointer = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)
    if pointer:
        return [pointer.group(1)]
    decl = re.sub(r"\[[^\]]*\]", "", decl)
    name = re.search(r"(\w+)\s*$", decl)
    if not name:
        raise SystemExit(f"layout_check: cannot read the field declaration '{decl}'")
    return [name.group(1)]


def layout(cc, include_dirs, headers_dir):
    """{'struct sizeof': n, 'struct.field': offset} of the headers in headers_dir/hasten."""
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    body = []
    for h in HEADERS:
        path = os.path.join(headers_dir, "hasten", h)
        if not os.path.exists(path):
            continue
        lines.append(f"#include <hasten/{h}>")
        for name, fields in structs(open(path).read()):
            body.append(f'  printf("{name} sizeof %zu\\n", sizeof(struct {name}));')
            for f in fields:
                body.append(f'  printf("{name}.{f} %zu\\n", offsetof(struct {name}, {f}));')
    src = "\n".join(lines) + "\nint main(void) {\n" + "\n".join(body) + "\n  return 0;\n}\n"
    with tempfile.TemporaryDirectory() as d:
        c, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
        with open(c, "w") as f:
            f.write(src)
        flags = [f"-I{headers_dir}"] + [f"-I{i}" for i in include_dirs]
        p = subprocess.run([cc, "-std=c99", *flags, c, "-o", exe], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"layout_check: the layout program does not compile:\n{p.stderr}")
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    table = {}
    for line in out.splitlines():
        key, value = line.rsplit(" ", 1)
        table[key] = int(value)
    return table


def minor_of(headers_dir):
    text = open(os.path.join(headers_dir, "hasten", "plugin.h")).read()
    return int(re.search(r"#define HASTEN_ABI_MINOR (\d+)", text).group(1))


def read_table(path):
    table = {}
    for line in open(path):
        if line.strip() and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            table[key] = int(value)
    return table


# The one layout change made on purpose, with what keeps old plugins working: 1.1 put
# HASTEN_STRUCT_HEADER in front of hasten_scalar, and the host hands a tracker whose vtable
# says 1.0 the 1.0 layout {name, value} (core/src/trackers/tracker_instance.hpp).
ALLOWED_MOVES = {("hasten_scalar.name", 0), ("hasten_scalar.value", 0)}


def problems(current, minor, layouts):
    """What breaks the rules, one line each."""
    out = []
    frozen = sorted(int(n[2:-4]) for n in os.listdir(layouts) if re.fullmatch(r"1\.\d+\.txt", n))
    if minor not in frozen:
        out.append(f"no frozen table for ABI 1.{minor}: write tests/abi/layouts/1.{minor}.txt (--write)")
    for m in frozen:
        if m > minor:
            continue
        table = read_table(os.path.join(layouts, f"1.{m}.txt"))
        for key, value in table.items():
            if key.endswith(" sizeof"):
                if key not in current:
                    out.append(f"struct {key[:-7]} of ABI 1.{m} is gone")
                elif current[key] < value:
                    out.append(f"struct {key[:-7]} shrank from {value} bytes in ABI 1.{m} to {current[key]}")
            elif key not in current:
                out.append(f"{key} of ABI 1.{m} is gone (fields are only ever appended)")
            elif current[key] != value and (key, m) not in ALLOWED_MOVES:
                out.append(f"{key} was at offset {value} in ABI 1.{m} and is at {current[key]} now "
                           "(fields are only ever appended)")
        if m == minor:
            for key in sorted(set(current) - set(table)):
                what = f"struct {key[:-7]}" if key.endswith(" sizeof") else key
                out.append(f"{what} is not in ABI 1.{m}'s frozen table: a field appended needs HASTEN_ABI_MINOR "
                           f"{m + 1}, a line in plugin.h's table of minors and tests/abi/layouts/1.{m + 1}.txt")
            for key in sorted(k for k in table if k.endswith(" sizeof") and k in current and current[k] != table[k]):
                out.append(f"struct {key[:-7]} is {current[key]} bytes, ABI 1.{m}'s table says {table[key]}")
    return out


def main():
    if len(sys.argv) < 5:
        raise SystemExit(__doc__)
    cc, sdk_include, dlpack, layouts = sys.argv[1:5]
    mode = sys.argv[5] if len(sys.argv) > 5 else ""
    if mode == "--write":
        minor = minor_of(sdk_include)
        table = layout(cc, [dlpack], sdk_include)
        with open(os.path.join(layouts, f"1.{minor}.txt"), "w") as f:
            f.write(f"# ABI 1.{minor}: sizeof and offsetof of every struct of the SDK's C headers "
                    "(tests/abi/layout_check.py --write)\n")
            for key in sorted(table):
                f.write(f"{key} {table[key]}\n")
        print(f"wrote tests/abi/layouts/1.{minor}.txt: {len(table)} entries")
        return
    if mode == "--show-a-moved-field":
        # A copy of the headers with two fields of hasten_option_spec swapped must fail.
        with tempfile.TemporaryDirectory() as d:
            shutil.copytree(os.path.join(sdk_include, "hasten"), os.path.join(d, "hasten"))
            path = os.path.join(d, "hasten", "plugin.h")
            text = open(path).read()
            a = "  const char* help;         /* one line                                                     */\n"
            b = "  int32_t flags;            /* HASTEN_OPTION_HAS_MIN | HASTEN_OPTION_HAS_MAX                */\n"
            if a + b not in text:
                raise SystemExit("layout_check: the two fields to swap are not in plugin.h as expected")
            with open(path, "w") as f:
                f.write(text.replace(a + b, b + a))
            found = problems(layout(cc, [dlpack], d), minor_of(d), layouts)
        moved = [p for p in found if p.startswith("hasten_option_spec.")]
        for minor in range(2, minor_of(sdk_include) + 1):  # hasten_option_spec exists since 1.2
            for field in ("help", "flags"):
                if not any(p.startswith(f"hasten_option_spec.{field} ") and f"in ABI 1.{minor} " in p for p in moved):
                    raise SystemExit(f"FAIL: moving hasten_option_spec.{field} went unnoticed for ABI 1.{minor}:\n"
                                     + "\n".join(found))
        print("ok: a copy of plugin.h with hasten_option_spec's help and flags swapped fails the check:")
        for p in moved:
            print("  " + p)
        return
    current = layout(cc, [dlpack], sdk_include)
    found = problems(current, minor_of(sdk_include), layouts)
    if found:
        raise SystemExit("FAIL: the ABI's layout changed:\n" + "\n".join("  " + p for p in found))
    structs_n = sum(1 for k in current if k.endswith(" sizeof"))
    print(f"ok: {structs_n} structs, {len(current) - structs_n} fields at their frozen offsets for every minor "
          f"1.0 to 1.{minor_of(sdk_include)}")


if __name__ == "__main__":
    main()
