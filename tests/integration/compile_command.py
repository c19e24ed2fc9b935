"""The project's own compile command for one source file, from the build directory's
compile_commands.json (the tests that compile snippets run in the build directory)."""
import json
import os
import shlex
import sys


def command_for(source):
    """(arguments, directory) of source's compile command; exits with a FAIL line if none."""
    with open("compile_commands.json") as f:
        entries = json.load(f)
    for e in entries:
        if os.path.realpath(e["file"]) == os.path.realpath(source):
            args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
            return args, e["directory"]
    print(f"FAIL: no compile command for {source} in compile_commands.json")
    sys.exit(1)
