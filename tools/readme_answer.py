"""The README's quoted chat answer, asked of a running server and compared with (or written into) README.md.

The README quotes what a fresh clone's ``make serve`` answers to its example request (greedy, the
default model and settings). ``tests/serve/test_readme_answer.py`` starts that server and fails when
the quote differs, so the README cannot go stale; after a change that moves the answer:

    make serve &   # or any server with the defaults
    python tools/readme_answer.py --url http://127.0.0.1:8000 --write

rewrites the quoted block and its token count from the live answer.
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
# the sentence before the quote (its token count and finish reason) and the quote itself
_QUOTE = re.compile(r"(CPU; )(\d+)( tokens,\n`finish_reason: \")(\w+)(\"[^\n]*\n\n````text\n)(.*?)(\n````\n)", re.S)


def ask(url: str) -> tuple[str, int, str]:
    """``(answer text, completion tokens, finish reason)`` of the README's request to the server at ``url``."""
    r = httpx.post(url + "/v1/chat/completions", json=REQUEST, timeout=600)
    r.raise_for_status()
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"], body["choices"][0][
        "finish_reason"]


def quoted(text: str | None = None) -> tuple[str, int, str]:
    """``(answer, tokens, finish reason)`` as README.md quotes them."""
    m = _QUOTE.search(text if text is not None else README.read_text())
    if m is None:
        raise ValueError(f"{README}: the quoted answer (a ````text block after 'CPU; N tokens') is missing")
    return m.group(6), int(m.group(2)), m.group(4)


def write(answer: str, tokens: int, finish: str) -> None:
    """Put the answer, its token count and its finish reason in README.md's quote."""
    text = README.read_text()
    quoted(text)  # raises when the block is missing
    README.write_text(_QUOTE.sub(lambda m: f"{m.group(1)}{tokens}{m.group(3)}{finish}{m.group(5)}{answer}{m.group(7)}",
                                 text, count=1))


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
