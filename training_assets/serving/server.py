"""Serve a model folder behind an OpenAI-compatible server on 127.0.0.1, and stop it.

    with ModelServer(ServeSpec(model_dir=folder)) as server:     # transformers serve on CPU
        client = chat_client(server.base_url)                    # http://127.0.0.1:PORT/v1
        client.chat.completions.create(model=server.model, ...)

Engines: ``transformers`` (``transformers serve``, in transformers itself: no server is written
here) and ``vllm`` (``vllm serve`` with the Hermes tool-call parser, for a GPU host; refused with
the reason where vLLM is not installed). ``auto`` takes vLLM when CUDA and vLLM are both present.
The server is a child process in its own process group, bound to 127.0.0.1 on a free port; start
waits for ``/health`` (or the process dying: its log tail is the error) and ``stop`` ends the
whole group, so no server outlives the loop or a test. Its output goes to a log file beside the
caller's choice (``log_path``), never to the terminal.

A LoRA checkpoint is served merged (``servable_folder``: the adapter folded into its base once,
saved under the data root): ``transformers serve`` loads plain model folders only. vLLM serves
adapters at runtime (``deploy``), which this seam leaves to the deploy path.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from training_assets.checkpoint_loading import load_checkpoint, resolve_checkpoint
from training_assets.storage import sha256_tree

HOST = "127.0.0.1"
TOOL_CALL_PARSER = "hermes"  # matches base_model.template's format


class ServeError(RuntimeError):
    """The server could not start or answer; one line naming the cause and the fix."""


@dataclass(frozen=True)
class ServeSpec:
    model_dir: str
    engine: Literal["auto", "transformers", "vllm"] = "auto"
    port: int = 0  # 0: a free port
    dtype: str = "auto"  # transformers serve --dtype (float32 is faster than bf16 on most CPUs)
    startup_timeout_s: float = 180.0
    log_path: str | None = None
    # transformers serve --continuous-batching: concurrent requests decode in one batch (16 held-out
    # tasks, 8 in flight, SmolLM2-135M on 2 cores: 52 s against 67 s without), but on CPU with its KV
    # cache capped (below) a server under load stopped answering mid-run (25 of 105 requests, then
    # none for minutes at full CPU): off by default here; vLLM always batches
    continuous_batching: bool = False
    # its KV cache's share of free memory: transformers' default (0.6-0.9) took 14 GB of this 24 GB host,
    # and two servers at once (a test beside the loop) were killed for memory
    cb_memory_fraction: float = 0.05


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def pick_engine(engine: str) -> str:
    if engine != "auto":
        return engine
    cuda = False
    if importlib.util.find_spec("torch") is not None:
        import torch  # heavy: only to ask whether a GPU is here when the engine is auto

        cuda = torch.cuda.is_available()
    return "vllm" if cuda and importlib.util.find_spec("vllm") is not None else "transformers"


def serve_command(spec: ServeSpec, engine: str, port: int) -> list[str]:
    if engine == "transformers":
        return [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve",
                spec.model_dir, "--host", HOST, "--port", str(port), "--dtype", spec.dtype, "--log-level", "warning",
                *(["--continuous-batching", "--cb-max-memory-percent", str(spec.cb_memory_fraction)]
                  if spec.continuous_batching else ["--no-continuous-batching"])]
    if engine == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ServeError("engine vllm: vLLM is not installed here (it needs a CUDA host: pip install "
                             "'training-assets[serve]'); use engine='transformers' on CPU")
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model_dir,
                "--served-model-name", spec.model_dir, "--host", HOST, "--port", str(port),
                "--enable-auto-tool-choice", "--tool-call-parser", TOOL_CALL_PARSER]
    raise ServeError(f"engine {engine!r}: choose auto, transformers or vllm")


class ModelServer:
    """One served model folder; a context manager that always stops what it started."""

    def __init__(self, spec: ServeSpec) -> None:
        if not (Path(spec.model_dir) / "config.json").is_file():
            raise ServeError(f"{spec.model_dir}: not a model folder (no config.json); pass a checkpoint's "
                             "servable folder (serving.servable_folder)")
        self.spec = spec
        self.engine = pick_engine(spec.engine)
        self.port = spec.port or free_port()
        self.model = spec.model_dir  # the name requests use: both engines serve it under its path
        self.process: subprocess.Popen | None = None
        self.log_path = Path(spec.log_path) if spec.log_path else Path(spec.model_dir).parent / f"serve-{self.port}.log"

    def in_flight(self, requested: int) -> int:
        """How many requests a client should keep in flight: ``transformers serve`` without continuous
        batching generates one request at a time, so more would only queue behind it, and each queued
        request's timeout would run while it waits (under load, a queue of 120 s timeouts, retried)."""
        sequential = self.engine == "transformers" and not self.spec.continuous_batching
        return 1 if sequential else requested

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.port}/health", timeout=2) as resp:
                return resp.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return " ".join(self.log_path.read_text(errors="replace").split())[-400:]
        return ""

    def start(self) -> ModelServer:
        cmd = serve_command(self.spec, self.engine, self.port)
        env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "TQDM_DISABLE": "1"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, start_new_session=True)
        deadline = time.monotonic() + self.spec.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServeError(f"{self.engine} serve {self.spec.model_dir} exited with {self.process.returncode}: "
                                 f"{self._log_tail()}")
            if self._healthy():
                return self
            time.sleep(0.5)
        self.stop()
        raise ServeError(f"{self.engine} serve {self.spec.model_dir} did not answer /health within "
                         f"{self.spec.startup_timeout_s:.0f} s (log {self.log_path}); raise startup_timeout_s")

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def servable_folder(checkpoint_dir: str | os.PathLike[str], cache_root: str | os.PathLike[str]) -> Path:
    """A plain model folder for ``checkpoint_dir``: itself when it holds full weights, else its LoRA
    adapter merged into its base once, saved (atomically) under ``cache_root/<content hash>``."""
    dirs = resolve_checkpoint(checkpoint_dir)
    if not dirs.is_adapter:
        folder = Path(dirs.checkpoint_dir)
        if (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file():
            return folder
    target = Path(cache_root) / sha256_tree(dirs.checkpoint_dir)[:16]
    if (target / "config.json").is_file():
        return target
    model, tokenizer = load_checkpoint(checkpoint_dir, merge_adapter=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
    return target
