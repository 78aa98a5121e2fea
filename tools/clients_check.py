"""`make clients-check`: clients nobody here wrote, unpatched, against a live `python -m paged.serve`.

Runs, in this order, with the clients installed in their own venv (``--clients-python``):

1. lm-eval ``local-completions`` on the shipped task set (``tools/clients/tasks``: a multiple-choice
   task scored by log-likelihood through ``echo`` + ``logprobs``, and a generation task), with
   ``tokenizer_backend=remote`` so lm-eval tokenizes through the server's ``/tokenize``,
   ``/detokenize`` and ``/tokenizer_info``;
2. lm-eval ``local-chat-completions`` on the generation task (``--apply_chat_template``);
3. guidellm, ``synchronous`` and then ``sweep``, short runs (a few dozen requests, seconds each);
4. the ``openai-agents`` SDK's tool loop, over chat completions and over the Responses API, and the
   official client's Responses stream (``tools/clients/openai_surface.py``);
5. with the server stopped, lm-eval's ``hf`` model (transformers) on the same GGUF weights, float32.

Then it compares: each task's accuracy must be the same for paged and transformers, and each
multiple-choice item's log-likelihood within ``MAX_ABS_LOGLIKELIHOOD_DELTA``; guidellm must finish
with no errored request. The figures (accuracies, the largest |Δ log-likelihood|, identical
generations, guidellm's table, the agent loops), with the machine and the date, go to
``OUT/summary.md``; the exit status is 0 only if every check held.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tools" / "clients" / "tasks"
SERVED_NAME = "smollm2"
STARTUP_TIMEOUT_S = 900  # generous: a first start builds the C++ kernels, minutes on a loaded machine
# float32 on both sides, but different kernels sum in different orders (paged's attention over
# blocks, transformers' SDPA): a continuation's log-likelihood is a sum of ~1-5 token logprobs,
# each off by ~1e-6 relative. 1e-3 is far above that and far below a real difference (a wrong
# token, position or BOS moves a log-likelihood by more than 0.1).
MAX_ABS_LOGLIKELIHOOD_DELTA = 1e-3
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL": "WARNING"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            if line.startswith("Model name:"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def run(cmd: list[str], log: Path, env: dict | None = None, timeout: float = 3600) -> None:
    """Run ``cmd`` with its output in ``log``; raise with the log's tail if it fails."""
    print("+", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **OFFLINE,
                                                                                      **(env or {})},
                            timeout=timeout, check=False).returncode
    print(f"  exit {rc} after {time.monotonic() - t0:.0f} s (log: {log})", flush=True)
    if rc != 0:
        raise SystemExit(f"{cmd[0]} failed ({rc}):\n" + log.read_text()[-3000:])


class Server:
    def __init__(self, model: str, out: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(out / "server.log", "w")  # noqa: SIM115 (open while the server runs)
        cmd = [sys.executable, "-m", "paged.serve", "--model", model, "--served-model-name", SERVED_NAME,
               "--port", str(self.port), "--dtype", "float32", "--device", "cpu", "--seed", "0",
               "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
        print("+", " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited with {self.proc.returncode}; see {out / 'server.log'}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the server was not healthy after {STARTUP_TIMEOUT_S} s; see {out / 'server.log'}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


REUSE = False  # --reuse: keep a step's results from an earlier run in the same folder


def lm_eval(py: str, out: Path, name: str, model: str, model_args: str, tasks: str, chat: bool) -> Path:
    folder = out / f"lm-eval-{name}"
    if REUSE and glob.glob(str(folder / "**" / "results_*.json"), recursive=True):
        print(f"reusing {folder}")
        return folder
    cmd = [py, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks", tasks,
           "--include_path", str(TASKS), "--output_path", str(folder), "--log_samples", "--batch_size", "1",
           "--seed", "1234"] + (["--device", "cpu"] if model == "hf" else [])
    run(cmd + (["--apply_chat_template"] if chat else []), out / f"lm-eval-{name}.log")
    return folder


def read_results(folder: Path) -> tuple[dict, dict]:
    """``({task: accuracy}, {task: [sample, ...] by doc_id})`` of one lm-eval run."""
    results = json.loads(Path(max(glob.glob(str(folder / "**" / "results_*.json"), recursive=True)))
                         .read_text())["results"]
    accuracy = {task: r.get("acc,none", r.get("exact_match,none")) for task, r in results.items()}
    samples = {}
    for path in glob.glob(str(folder / "**" / "samples_*.jsonl"), recursive=True):
        task = Path(path).name.split("samples_", 1)[1].rsplit("_", 1)[0]
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        samples[task] = {r["doc_id"]: r for r in rows}
    return accuracy, samples


def loglikelihood_deltas(a: dict, b: dict) -> list[float]:
    """|Δ log-likelihood| of every (item, choice) of the multiple-choice task."""
    deltas = []
    for doc_id, row in a.items():
        for ra, rb in zip(row["resps"], b[doc_id]["resps"]):
            deltas.append(abs(float(ra[0][0]) - float(rb[0][0])))
    return deltas


def same_generations(a: dict, b: dict) -> tuple[int, int]:
    same = sum(a[d]["filtered_resps"] == b[d]["filtered_resps"] for d in a)
    return same, len(a)


def hf_tokenizer(py: str, gguf: Path, out: Path) -> Path:
    """The GGUF's tokenizer as a Hugging Face folder (guidellm counts its synthetic prompts with it)."""
    folder = out / "hf-tokenizer"
    code = ("import sys; from transformers import AutoTokenizer; "
            "AutoTokenizer.from_pretrained(sys.argv[1], gguf_file=sys.argv[2]).save_pretrained(sys.argv[3])")
    run([py, "-c", code, str(gguf.parent), gguf.name, str(folder)], out / "hf-tokenizer.log")
    return folder


def guidellm(py: str, out: Path, server: Server, tokenizer: Path, profile: str, constraints: list[str]) -> dict:
    report = out / f"guidellm-{profile}.json"
    if REUSE and report.exists():
        print(f"reusing {report}")
        return json.loads(report.read_text())
    guidellm_bin = str(Path(py).parent / "guidellm")
    cmd = [guidellm_bin, "run", "--backend", f"kind=openai_http,target={server.url},model={SERVED_NAME}",
           "--profile", f"kind={profile}" + (",sweep_size=4" if profile == "sweep" else ""),
           "--data", "kind=synthetic_text,prompt_tokens=64,output_tokens=16",
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
           "--seed", "kind=static,value=42",
           "--output", f"kind=json,path={report}", "--output", "kind=console", "--disable-progress"]
    for c in constraints:
        cmd += ["--constraint", c]
    run(cmd, out / f"guidellm-{profile}.log", timeout=900)
    return json.loads(report.read_text())


def openai_surface(py: str, out: Path, server: Server) -> dict:
    """The agent tool loops and the Responses stream (``tools/clients/openai_surface.py``), as its report."""
    log = out / "openai-surface.log"
    print(f"+ {py} tools/clients/openai_surface.py {server.url}/v1 {SERVED_NAME}", flush=True)
    with open(log, "w") as f:
        done = subprocess.run([py, str(ROOT / "tools" / "clients" / "openai_surface.py"), f"{server.url}/v1",
                               SERVED_NAME], cwd=ROOT, stdout=subprocess.PIPE, stderr=f, text=True, timeout=900,
                              env={**os.environ, **OFFLINE}, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"openai_surface.py printed no report (exit {done.returncode}):\n" + log.read_text()[-3000:])
    return json.loads(lines[-1])


def check_dry_run(report: Path) -> int:
    """Fail if pip's dry-run report would install a torch or any nvidia-* package (a CUDA build)."""
    names = [item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]]
    bad = [n for n in names if n in ("torch", "triton") or n.startswith("nvidia")]
    if bad:
        print(f"the clients would pull {bad}: pin them or they replace torch 2.13.0 (CPU build)", file=sys.stderr)
        return 1
    print(f"dry run: {len(names)} packages to install, no torch, triton or nvidia-* among them")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients-python", help="the python of the venv with lm-eval and guidellm")
    p.add_argument("--model", help="the GGUF file served and given to transformers")
    p.add_argument("--out", default=str(ROOT / "build" / "clients-check"))
    p.add_argument("--check-dry-run", metavar="REPORT", help="only check a pip --dry-run --report file")
    p.add_argument("--reuse", action="store_true", help="keep the results of steps an earlier run finished")
    args = p.parse_args()
    global REUSE
    REUSE = args.reuse
    if args.check_dry_run:
        return check_dry_run(Path(args.check_dry_run))
    if not (args.clients_python and args.model):
        p.error("--clients-python and --model are needed")
    out, gguf, py = Path(args.out), Path(args.model).resolve(), args.clients_python
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    failures: list[str] = []

    tokenizer = hf_tokenizer(py, gguf, out)
    server = Server(str(gguf), out)
    try:
        base = server.url
        paged_dir = lm_eval(py, out, "paged-completions", "local-completions",
                            f"model={SERVED_NAME},base_url={base}/v1/completions,tokenizer_backend=remote,"
                            "num_concurrent=1,max_retries=1,tokenized_requests=True",
                            "paged_mc,paged_gen", chat=False)
        chat_dir = lm_eval(py, out, "paged-chat", "local-chat-completions",
                           f"model={SERVED_NAME},base_url={base}/v1/chat/completions,tokenizer_backend=none,"
                           "num_concurrent=1,max_retries=1", "paged_gen", chat=True)
        sync = guidellm(py, out, server, tokenizer, "synchronous", ["kind=max_requests,count=12"])
        # each strategy of the sweep needs finished requests, and one takes seconds on a loaded machine
        sweep = guidellm(py, out, server, tokenizer, "sweep",
                         ["kind=max_requests,count=10", "kind=max_duration,seconds=60"])
        surface = openai_surface(py, out, server)
    finally:
        server.stop()
    # the device goes as --device (lm-eval 0.4.13 passes its own device to HFLM beside model_args)
    hf_args = f"pretrained={gguf.parent},gguf_file={gguf.name},tokenizer={tokenizer},dtype=float32"
    hf_dir = lm_eval(py, out, "hf", "hf", hf_args, "paged_mc,paged_gen", chat=False)
    hf_chat_dir = lm_eval(py, out, "hf-chat", "hf", hf_args, "paged_gen", chat=True)

    acc_paged, s_paged = read_results(paged_dir)
    acc_chat, s_chat = read_results(chat_dir)
    acc_hf, s_hf = read_results(hf_dir)
    acc_hf_chat, s_hf_chat = read_results(hf_chat_dir)
    deltas = loglikelihood_deltas(s_paged["paged_mc"], s_hf["paged_mc"])
    same_gen = same_generations(s_paged["paged_gen"], s_hf["paged_gen"])
    same_chat = same_generations(s_chat["paged_gen"], s_hf_chat["paged_gen"])
    for task in ("paged_mc", "paged_gen"):
        if acc_paged[task] != acc_hf[task]:
            failures.append(f"{task}: local-completions accuracy {acc_paged[task]} != transformers {acc_hf[task]}")
    if acc_chat["paged_gen"] != acc_hf_chat["paged_gen"]:
        failures.append(f"paged_gen (chat): {acc_chat['paged_gen']} != transformers {acc_hf_chat['paged_gen']}")
    if max(deltas) > MAX_ABS_LOGLIKELIHOOD_DELTA:
        failures.append(f"max |Δ log-likelihood| {max(deltas):.3g} > {MAX_ABS_LOGLIKELIHOOD_DELTA}")

    for check, report in surface.items():
        if not report["ok"]:
            failures.append(f"{check}: {json.dumps(report)[:300]}")
    rows = []
    for label, report in (("synchronous", sync), ("sweep", sweep)):
        for b in report["benchmarks"]:
            row = guidellm_row(b)
            rows.append((label, *row))
            if row[2]:
                failures.append(f"guidellm {label}/{row[0]}: {row[2]} errored requests")

    lines = [
        f"# make clients-check, {started:%Y-%m-%d %H:%M} UTC", "",
        (f"Machine: {machine()} (shared with other developers' jobs while it ran); model {gguf.name}, "
         "float32, served by `python -m paged.serve` with its defaults."), "",
        "| lm-eval task | paged (endpoint) | transformers |", "|---|---|---|",
        f"| paged_mc (40 items, acc) | {acc_paged['paged_mc']:.3f} (local-completions) | {acc_hf['paged_mc']:.3f} |",
        (f"| paged_gen (24 items, exact match) | {acc_paged['paged_gen']:.3f} (local-completions) | "
         f"{acc_hf['paged_gen']:.3f} |"),
        (f"| paged_gen, chat template | {acc_chat['paged_gen']:.3f} (local-chat-completions) | "
         f"{acc_hf_chat['paged_gen']:.3f} |"), "",
        (f"Largest |Δ log-likelihood| over the {len(deltas)} (item, choice) pairs: {max(deltas):.2e} "
         f"(mean {sum(deltas) / len(deltas):.2e}); identical generations: {same_gen[0]}/{same_gen[1]} "
         f"(completions), {same_chat[0]}/{same_chat[1]} (chat)."), "",
        "| guidellm profile | strategy | requests ok | errored | req/s | TTFT median (ms) | ITL median (ms) |",
        "|---|---|---|---|---|---|---|"]
    for label, strategy, ok, errored, rate, ttft, itl in rows:
        lines.append(f"| {label} | {strategy} | {ok} | {errored} | {rate:.2f} | {ttft:.0f} | {itl:.1f} |")
    lines += ["", "| openai-agents / Responses check | what happened | ok |", "|---|---|---|"]
    for api in ("chat", "responses"):
        r = surface[f"agents_{api}"]
        lines.append(f"| agent tool loop over {api} | tool called with {r['tool_calls']}, items {r['items']}, "
                     f"final answer {r['final_output'][:60]!r} | {r['ok']} |")
    r = surface["responses_stream"]
    lines.append(f"| Responses stream (official client) | {r['events']} events, {r['first'][0]} ... {r['last']}, "
                 f"output {r['output_text']!r} | {r['ok']} |")
    lines += ["", "Result: " + ("every check held" if not failures else "FAILED: " + "; ".join(failures))]
    summary = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(summary)
    print(summary)
    return 1 if failures else 0


def guidellm_row(benchmark: dict) -> tuple:
    """``(strategy, ok, errored, requests/s, TTFT median ms, ITL median ms)`` of one guidellm benchmark."""
    def metric(name: str, stat: str = "median") -> float:
        m = benchmark["metrics"][name]
        m = m.get("successful", m)
        return float(m.get(stat) or 0.0)

    totals = benchmark["metrics"]["request_totals"]
    config = benchmark["config"]["strategy"]
    strategy = config["type_"] + (f" @ {config['rate']:.2f}/s" if config.get("rate") else "")
    return (strategy, int(totals.get("successful", 0)), int(totals.get("errored", 0)),
            metric("requests_per_second", "mean"), metric("time_to_first_token_ms"),
            metric("inter_token_latency_ms"))


if __name__ == "__main__":
    sys.exit(main())
