"""The ``vllm_grpo`` check of ``gpu_smoke.py``: a real ``vllm serve`` and the project's GRPO with rollout="vllm".

    python benchmarks/gpu_smoke.py --checks vllm_grpo --vllm-steps 3

A small random-init Qwen2 (hidden 256, 4 layers) and a BPE tokenizer trained here are saved to a
temporary folder; ``vllm serve`` starts on 127.0.0.1 with runtime LoRA updating, an API key and
``--logprobs-mode processed_logprobs``; the trainer runs ``steps`` optimizer steps with LoRA r=8,
syncing its adapter after each (``trainers/policy_sync.py``). Figures: server start-up, s/step, the
adapter versions loaded, retries. The server is stopped whatever happens. Not a benchmark of
its own (``make bench`` skips ``*gpu_smoke*``).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

TEXTS = [f"The answer is {i}. Tool call search({i * 7}) returned ok. What is {i} plus one?" for i in range(200)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _save_base(folder: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from training_assets.tokenizer_trainer import train_tokenizer

    tokenizer = train_tokenizer(TEXTS, vocab_size=400)
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512,
                                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=1024, tie_word_embeddings=True,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))


def _wait_ready(url: str, key: str, process: subprocess.Popen, log: Path, timeout_s: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {process.returncode}: {log.read_text()[-1500:]}")
        request = urllib.request.Request(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback
                if response.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(2)
    raise RuntimeError(f"vllm serve not ready after {timeout_s:.0f} s: {log.read_text()[-1500:]}")


def run_vllm_grpo(steps: int = 3, startup_timeout_s: float = 420.0) -> dict:
    from training_assets.trainers import GrpoSpec, LoraSpec, TrainConfig, get_trainer
    from training_assets.trainers.config import VllmSpec

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = root / "base"
        _save_base(base)
        port, key = _free_port(), secrets.token_hex(16)
        url = f"http://127.0.0.1:{port}"
        log = root / "vllm.log"
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(base),
               "--served-model-name", "base", "--host", "127.0.0.1", "--port", str(port), "--api-key", key,
               "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--max-model-len", "512",
               "--gpu-memory-utilization", "0.25", "--enforce-eager", "--logprobs-mode", "processed_logprobs"]
        env = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")
        with open(log, "w") as out:
            process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            startup_s = _wait_ready(url, key, process, log, startup_timeout_s)
            os.environ["GPU_SMOKE_VLLM_KEY"] = key
            config = TrainConfig(base_model=str(base), output_dir=str(root / "out"), run_name="smoke", max_steps=steps,
                                 batch_size=2, lr=1e-4, precision="bf16", lora=LoraSpec(r=8, alpha=16),
                                 grpo=GrpoSpec(rollout="vllm", num_generations=4, max_new_tokens=16,
                                               vllm=VllmSpec(base_url=url, model="base",
                                                             api_key_env="GPU_SMOKE_VLLM_KEY")))
            groups = [{"group_id": str(i), "prompt": json.dumps([{"role": "user", "content": f"what is {i} plus one?"}]),
                       "completions": [], "rewards": [], "advantages": [], "expected_answer": str(i + 1)}
                      for i in range(2 * steps)]
            t0 = time.perf_counter()
            result = get_trainer("grpo", config, reward_fn=lambda completions, **kw: [float(len(c) % 5) for c in
                                                                                     completions]).train(groups)
            wall = time.perf_counter() - t0
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    losses = list(result["losses"])
    expected = [f"smoke-v{s}" for s in range(1, steps)]
    return {"startup_s": round(startup_s, 1), "steps": result["steps"], "s_per_step": round(wall / max(steps, 1), 2),
            "adapters": result["vllm_adapters"], "retries": result["vllm_retries"], "losses": losses,
            "ok": result["vllm_adapters"] == expected and all(x == x for x in losses)}
