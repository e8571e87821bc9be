"""A fake vLLM OpenAI-compatible server for tests: in-process (a thread) or as its own process.

    with spawn(api_key_env="FAKE_KEY", base_model="base", vocab_size=400, record_dir=tmp) as server:
        server.inject("/v1/completions", [429, 503])   # the next two completions fail so
        ...                                            # point the client at server.base_url
        state = server.state()                         # calls, loads (with the copied adapter files)

    server = FakeVllm(api_key="s3cret")                # in-process; .calls, .adapters, .close()

    python tests/fake_vllm.py --api-key-env FAKE_KEY --vocab-size 400   # prints "READY <url>"

It binds 127.0.0.1 on a free port (or the one asked for) and speaks what the project uses of vLLM:
``GET /v1/models``, ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (a duplicate name is
a 400, as in vLLM; the adapter folder must hold ``adapter_config.json`` and a readable
``adapter_model.safetensors``, which is copied to ``record_dir`` as ``<name>.safetensors`` at load
time) and ``POST /v1/completions`` with ``logprobs`` + ``return_tokens_as_token_ids`` (``token_id:<n>``
tokens with a log-prob each; a model that is neither the base nor a loaded adapter is a 404). With
an API key, a request without ``Authorization: Bearer <key>`` is a 401. Every request is recorded
(also refused ones). ``/_fake/state`` and ``/_fake/inject`` are the test's control endpoints.
Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _safetensors_names(path: Path) -> list[str]:
    """Tensor names in a safetensors file (its JSON header); ValueError when it is not one."""
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
    return sorted(k for k in header if k != "__metadata__")


class FakeVllmState:
    """What the server holds and has seen; the handler's only state (guarded by one lock)."""

    def __init__(self, api_key=None, base_model="base", vocab_size=64, record_dir=None, refuse_load=False):
        self.api_key, self.base_model, self.vocab_size = api_key, base_model, vocab_size
        self.record_dir, self.refuse_load = Path(record_dir) if record_dir else None, refuse_load
        self.adapters = {}  # name -> path
        self.calls = []  # ("GET", path) | ("POST", path, body)
        self.log = []  # {method, path, model, authorized, status}
        self.loads = []  # {name, path, tensors, copy}
        self.injected = {}  # path -> statuses still to answer
        self.lock = threading.Lock()

    def snapshot(self):
        with self.lock:
            return {"adapters": dict(self.adapters), "log": list(self.log), "loads": list(self.loads)}


def _handler(state):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            return None

        def _reply(self, status, body, model=None, authorized=True):
            if not self.path.startswith("/_fake/"):
                with state.lock:
                    state.log.append({"method": self.command, "path": self.path, "model": model,
                                      "authorized": authorized, "status": status})
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return None

        def _refused(self, model=None):
            """401 for a wrong key, else an injected failure; None when the request may go on."""
            if state.api_key and self.headers.get("Authorization") != f"Bearer {state.api_key}":
                return self._reply(401, {"error": "Unauthorized"}, model, authorized=False) or True
            with state.lock:
                queue = state.injected.get(self.path) or []
                status = queue.pop(0) if queue else None
            if status is not None:
                return self._reply(status, {"error": f"injected {status}"}, model) or True
            return None

        def do_GET(self):  # noqa: N802 (http.server API)
            if self.path == "/_fake/state":
                return self._reply(200, state.snapshot())
            state.calls.append(("GET", self.path))
            if self._refused():
                return None
            if self.path != "/v1/models":
                return self._reply(404, {"error": f"no route {self.path}"})
            cards = [{"id": state.base_model, "object": "model", "root": f"/models/{state.base_model}", "parent": None}]
            cards += [{"id": n, "object": "model", "root": p, "parent": state.base_model} for n, p in state.adapters.items()]
            return self._reply(200, {"object": "list", "data": cards})

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/_fake/inject":
                with state.lock:
                    state.injected.setdefault(body["path"], []).extend(int(s) for s in body["statuses"])
                return self._reply(200, {"ok": True})
            state.calls.append(("POST", self.path, body))
            if self._refused(body.get("model") or body.get("lora_name")):
                return None
            routes = {"/v1/load_lora_adapter": self._load, "/v1/unload_lora_adapter": self._unload,
                      "/v1/completions": self._complete}
            if self.path not in routes:
                return self._reply(404, {"error": f"no route {self.path}"})
            return routes[self.path](body)

        def _load(self, body):
            name, path = body["lora_name"], body["lora_path"]
            if state.refuse_load:
                return self._reply(400, {"error": "LoRA is not enabled"}, name)
            if name in state.adapters:
                return self._reply(400, {"error": f"The lora adapter '{name}' has already been loaded."}, name)
            folder = Path(path)  # read at load time, as vLLM does
            weights = folder / "adapter_model.safetensors"
            try:
                tensors = _safetensors_names(weights)
                json.loads((folder / "adapter_config.json").read_text())
            except (OSError, ValueError, struct.error) as exc:
                return self._reply(400, {"error": f"No adapter found for {path}: {exc}"}, name)
            copy = None
            if state.record_dir is not None:
                copy = state.record_dir / f"{name}.safetensors"
                shutil.copyfile(weights, copy)
            with state.lock:
                state.loads.append({"name": name, "path": path, "tensors": tensors, "copy": str(copy) if copy else None})
            state.adapters[name] = path
            return self._reply(200, {"status": "ok"}, name)

        def _unload(self, body):
            name = body["lora_name"]
            if state.adapters.pop(name, None) is None:
                return self._reply(404, {"error": f"The lora adapter '{name}' cannot be found."}, name)
            return self._reply(200, {"status": "ok"}, name)

        def _complete(self, body):
            model = body["model"]
            if model != state.base_model and model not in state.adapters:
                return self._reply(404, {"error": {"message": f"The model `{model}` does not exist.", "code": 404}}, model)
            if not body.get("return_tokens_as_token_ids") or body.get("logprobs") is None:
                return self._reply(400, {"error": "this fake answers token ids with log-probs only"}, model)
            rng = random.Random(json.dumps([model, body["prompt"]]))  # same request, same sample
            choices = []
            for _ in range(int(body.get("n", 1))):
                ids = [rng.randrange(state.vocab_size) for _ in range(int(body["max_tokens"]))]
                logps = [-math.log(state.vocab_size) - rng.random() for _ in ids]
                choices.append({"text": " ".join(f"t{i}" for i in ids), "finish_reason": "length",
                                "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": logps}})
            return self._reply(200, {"object": "text_completion", "model": model, "choices": choices}, model)

    return Handler


class FakeVllm:
    """The server in a thread of this process (state readable directly)."""

    def __init__(self, port=0, **state_kwargs):
        self.state = FakeVllmState(**state_kwargs)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self.state))
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def calls(self):
        return self.state.calls

    @property
    def adapters(self):
        return self.state.adapters

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class RemoteFakeVllm:
    """A handle on the server running as its own process (state read over its control endpoints)."""

    def __init__(self, base_url, process):
        self.base_url, self.process = base_url, process

    def _call(self, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def state(self):
        return self._call("/_fake/state")

    def inject(self, path, statuses):
        """The next ``len(statuses)`` requests to ``path`` (with a valid key) answer these statuses."""
        self._call("/_fake/inject", {"path": path, "statuses": list(statuses)})


@contextlib.contextmanager
def spawn(api_key_env=None, base_model="base", vocab_size=64, record_dir=None, timeout_s=20.0):
    """Run the server as a child process (the key passed through the environment); stop it on exit."""
    cmd = [sys.executable, __file__, "--base-model", base_model, "--vocab-size", str(vocab_size)]
    if api_key_env:
        cmd += ["--api-key-env", api_key_env]
    if record_dir:
        cmd += ["--record-dir", str(record_dir)]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        timer = threading.Timer(timeout_s, process.kill)  # a server that never gets ready fails the test, not hangs it
        timer.start()
        line = process.stdout.readline()
        timer.cancel()
        if not line.startswith("READY "):
            raise RuntimeError(f"fake vLLM did not start: {line!r} {process.stderr.read()[-2000:]}")
        yield RemoteFakeVllm(line.split()[1], process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--api-key-env", help="environment variable holding the key clients must send")
    parser.add_argument("--base-model", default="base")
    parser.add_argument("--vocab-size", type=int, default=64)
    parser.add_argument("--record-dir", help="copy each loaded adapter's safetensors here")
    args = parser.parse_args(argv)
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not key:
        parser.error(f"${args.api_key_env} is empty")
    state = FakeVllmState(api_key=key, base_model=args.base_model, vocab_size=args.vocab_size,
                          record_dir=args.record_dir)
    httpd = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(state))
    print(f"READY http://127.0.0.1:{httpd.server_address[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        httpd.serve_forever()


if __name__ == "__main__":
    main()
