"""Torn job lines: the share of contract lines another writer on the same pipe splits.

The node agent reads the job's stdout and stderr from one pipe, where TensorFlow's C++
threads write too. Here a job stand-in says `--lines` step lines while another process
writes fragments without a newline to the same pipe as fast as it can, twice in the same
run:

- print: `print(line, flush=True)` under PYTHONUNBUFFERED, as the job did (its text and
  its newline are two write(2) calls);
- say: `tpu_training.output.say`, one write(2) per line.

Prints the torn lines of each and the ratio.

    PYTHONPATH=$PWD/training .venv/image/bin/python bench/line_tearing.py [--lines 20000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

SAYER = """
import os, subprocess, sys
from tpu_training import output

ready, told = os.pipe()
noise = subprocess.Popen([sys.executable, "-c", "import os, sys; os.write(int(sys.argv[1]), "
                          "b'r')\\nwhile True: os.write(2, b'#')", str(told)], pass_fds=[told])
os.read(ready, 1)
for i in range({lines}):
    {say}
noise.kill()
"""
SAYS = {"print": 'print(f"tpu_training step={i} loss=0.5", flush=True)',
        "say": 'output.say(f"step={i} loss=0.5")'}


def torn(way: str, lines: int) -> int:
    script = SAYER.format(lines=lines, say=SAYS[way])
    done = subprocess.run([sys.executable, "-c", script], env=os.environ | {
        "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=True)
    text = done.stdout.decode()
    return sum(f"tpu_training step={i} loss=0.5\n" not in text for i in range(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=20000)
    lines = parser.parse_args().lines
    counts = {way: torn(way, lines) for way in SAYS}
    for way, count in counts.items():
        print(f"{way:>5}: {count} of {lines} lines torn ({count / lines:.2%})")
    print(f"say / print: {counts['say'] / max(counts['print'], 1):.3f}")


if __name__ == "__main__":
    main()
