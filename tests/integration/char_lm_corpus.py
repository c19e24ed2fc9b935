"""The fortunes corpus as hasten-char-lm reads it, written again from its description in
apps/examples/char_lm_data.hpp (not from the C++): the files, the fortunes, the held-out split,
the training text and its unigram entropy. The tests check the program's figures against it."""
import math
import os
from collections import Counter

FORTUNES = "/usr/share/games/fortunes"


def corpus_files(directory):
    if not os.path.isdir(directory):
        return []
    return sorted(n for n in os.listdir(directory)
                  if os.path.isfile(os.path.join(directory, n)) and not n.endswith((".dat", ".u8"))
                  and not n.startswith("."))


def fortunes_of(blob):
    """The fortunes of one file: the text between lines holding only '%', each line with its
    newline; blank fortunes dropped."""
    lines = blob.split(b"\n")
    if blob.endswith(b"\n"):
        lines = lines[:-1]
    out, current = [], b""
    for line in lines:
        if line == b"%":
            if current.strip(b" \t\r\n"):
                out.append(current)
            current = b""
        else:
            current += line + b"\n"
    if current.strip(b" \t\r\n"):
        out.append(current)
    return out


def split(directory, names=None, val_fraction=0.1):
    """(training text, held-out text), each fortune followed by b'%\\n'; fortune i (over the
    files in name order) is held out when floor((i+1) f) > floor(i f)."""
    train, val = [], []
    i = 0
    for name in sorted(names or corpus_files(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            for fortune in fortunes_of(f.read()):
                held_out = math.floor((i + 1) * val_fraction) > math.floor(i * val_fraction)
                (val if held_out else train).append(fortune + b"%\n")
                i += 1
    return b"".join(train), b"".join(val)


def unigram_entropy(text):
    counts = Counter(text)
    total = len(text)
    return -sum(c / total * math.log(c / total) for c in counts.values())
