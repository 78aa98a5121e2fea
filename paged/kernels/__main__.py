"""``python -m paged.kernels``: build the C++ CPU kernels now, showing the progress.

``make install`` runs it, so that ``make serve`` loads a built library in a
second instead of compiling for minutes on its first start. The build is
``paged.kernels.cpu.load(verbose=True, strict=True)`` — the same folder, lock and
flags as a first use — run in a child process: ninja's long ``[k/n] command``
lines (printed as each command ends) are shortened to the file it compiled and
the time so far, and the whole output is printed when the build fails. A second run finds the library
built and says so in the time it takes to import torch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

BUILD = ("from paged.kernels import cpu; "
         "print('library:', cpu.load(verbose=True, strict=True).__file__, flush=True)")
STEP = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")  # ninja's status prefix: edges done / edges in all


def describe(command: str) -> str:
    """What one ninja command did, in a few words: ``compiled fused_ops.cpp`` or ``linked paged_cpu.so``."""
    source = re.search(r" -c (\S+)", command)
    if source:
        return f"compiled {os.path.basename(source.group(1))}"
    target = re.search(r" -o (\S+)", command)
    return f"linked {os.path.basename(target.group(1))}" if target else command[:80]


def main() -> int:
    start = time.monotonic()
    print("C++ CPU kernels (csrc/cpu): building or checking the build...", flush=True)
    child = subprocess.Popen([sys.executable, "-c", BUILD], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    log, library, steps = [], None, 0
    for line in child.stdout:
        log.append(line)
        step = STEP.match(line)
        if step:
            steps += 1
            print(f"  [{step[1]}/{step[2]}] {describe(step[3])} ({time.monotonic() - start:.0f} s)", flush=True)
        elif line.startswith("library: "):
            library = line.removeprefix("library: ").strip()
        elif line.startswith("paged: waiting"):
            print(f"  {line.rstrip()}", flush=True)
        elif line.startswith("paged: compiling"):  # the first build of these sources here
            print("  compiling (once per checkout and CPU: a minute or more on 2 cores)", flush=True)
    if child.wait() != 0 or library is None:
        sys.stdout.writelines(log)
        print("python -m paged.kernels: the build failed (its output is above); the kernels need a C++ "
              "compiler with OpenMP (on Debian: apt-get install -y g++)", file=sys.stderr)
        return 1
    state = "built" if steps else "already built"
    print(f"C++ CPU kernels: {state} ({time.monotonic() - start:.0f} s): {library}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
