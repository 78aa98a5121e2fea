"""The README's quoted chat answer, asked of a running server and compared with (or written into) README.md.

The README quotes what a fresh clone's ``make serve`` answers to its example request (greedy, the
default model and settings). ``tests/serve/test_readme_answer.py`` starts that server and fails when
the quote differs, so the README cannot go stale; after a change that moves the answer:

    make serve &   # or any server with the defaults
    python tools/readme_answer.py --url http://127.0.0.1:8000 --write

rewrites the quoted block and its token count from the live answer.

The answer is a function of the model, the code and the CPU's kind: the kernels and oneDNN's GEMMs
sum in another order on a CPU without AVX-512 BF16, or with AMX, and a greedy near-tie can then go
the other way. So the README names the kind it was written on (``cpu_kind``), and the test compares
exactly on that kind only.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import httpx

README = Path(__file__).resolve().parents[1] / "README.md"
REQUEST = {"messages": [{"role": "user", "content": "write a function to reverse a list"}],
           "max_tokens": 200, "temperature": 0}
# the sentence before the quote (the CPU's kind, the token count, the finish reason) and the quote itself
_QUOTE = re.compile(r"(a CPU with )([^;]+)(; )(\d+)( tokens,\n`finish_reason: \")(\w+)(\"[^\n]*\n\n````text\n)(.*?)"
                    r"(\n````\n)", re.S)
KINDS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))


def cpu_kind(flags: str | None = None) -> str:
    """This CPU's kind as far as the answer's bits go: ``AMX``, ``AVX-512 BF16``, ``AVX-512`` or ``AVX2``."""
    if flags is None:
        try:
            flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
        except (OSError, StopIteration):
            flags = ""
    have = set(flags.split())
    return next((name for flag, name in KINDS if flag in have), "another kind")


def ask(url: str) -> tuple[str, int, str]:
    """``(answer text, completion tokens, finish reason)`` of the README's request to the server at ``url``."""
    r = httpx.post(url + "/v1/chat/completions", json=REQUEST, timeout=600)
    r.raise_for_status()
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"], body["choices"][0][
        "finish_reason"]


def _match(text: str | None):
    m = _QUOTE.search(text if text is not None else README.read_text())
    if m is None:
        raise ValueError(f"{README}: the quoted answer (a ````text block after 'a CPU with KIND; N tokens') is missing")
    return m


def quoted(text: str | None = None) -> tuple[str, int, str]:
    """``(answer, tokens, finish reason)`` as README.md quotes them."""
    m = _match(text)
    return m.group(8), int(m.group(4)), m.group(6)


def quoted_kind(text: str | None = None) -> str:
    """The CPU kind README.md says its quote was answered on."""
    return _match(text).group(2)


def write(answer: str, tokens: int, finish: str, kind: str | None = None) -> None:
    """Put the answer, its token count, its finish reason and the CPU's kind in README.md's quote."""
    text = README.read_text()
    _match(text)  # raises when the block is missing
    kind = kind or cpu_kind()
    README.write_text(_QUOTE.sub(lambda m: f"{m.group(1)}{kind}{m.group(3)}{tokens}{m.group(5)}{finish}{m.group(7)}"
                                           f"{answer}{m.group(9)}", text, count=1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--write", action="store_true", help="rewrite README.md's quote from the live answer")
    args = p.parse_args(argv)
    live = ask(args.url)
    if args.write:
        write(*live)
        print(f"README.md: quote rewritten ({live[1]} tokens, {live[2]})")
        return 0
    same = live == quoted()
    print("README.md's quote is the live answer" if same else f"README.md's quote differs; the live answer:\n{live[0]}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
