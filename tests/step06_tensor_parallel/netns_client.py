"""A client that runs inside the driver's network namespace (``ip netns exec NS python netns_client.py``).

The server listens on 127.0.0.1 of its namespace, which the test process
cannot reach; this script can. It takes ``PORT`` and a JSON list of
completion bodies, sends them all at once (one thread each), and prints one
JSON line per event, flushed at once so the test can act mid-stream:

    {"i": 3, "event": "first"}                              a stream's first token arrived
    {"i": 3, "event": "end", "status": 200, "text": "...", "tokens": 12, "done": true, "error": null}

``tokens`` counts the streamed chunks that carried text, ``done`` whether
``data: [DONE]`` came, ``error`` the message of an error event or body.
Standard library only: it starts in well under a second.
"""

import http.client
import json
import sys
import threading

TIMEOUT_S = 300  # any one socket read (a loaded 2-core machine); the test bounds the whole run as well

_print_lock = threading.Lock()


def emit(**fields) -> None:
    with _print_lock:
        print(json.dumps(fields), flush=True)


def one(port: int, i: int, body: dict) -> None:
    end = {"i": i, "event": "end", "status": None, "text": "", "tokens": 0, "done": False, "error": None}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        end["status"] = r.status
        if not body.get("stream") or r.status != 200:
            data = json.loads(r.read())
            if "error" in data:
                end["error"] = data["error"]["message"]
            else:
                end["text"], end["done"] = data["choices"][0]["text"], True
                end["tokens"] = data["usage"]["completion_tokens"]
        else:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    end["done"] = True
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    end["error"] = chunk["error"]["message"]
                    continue
                text = chunk["choices"][0]["text"]
                if text:
                    if end["tokens"] == 0:
                        emit(i=i, event="first")
                    end["tokens"] += 1
                    end["text"] += text
    except Exception as exc:  # a broken connection is an outcome the test judges, not a crash of the client
        end["error"] = end["error"] or f"client: {type(exc).__name__}: {exc}"
    emit(**end)


def main() -> None:
    port, bodies = int(sys.argv[1]), json.loads(sys.argv[2])
    threads = [threading.Thread(target=one, args=(port, i, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
