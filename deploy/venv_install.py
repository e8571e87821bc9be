"""Install a requirement into this interpreter's venv with uv, resolving as pip would here; pip if uv fails.

    .venv/bin/python deploy/venv_install.py -e '.[train,eval,dev,wandb,scale]'     # what `make setup` runs

uv installs the same packages ~5x faster than pip (a new machine of this kind, no caches: 13.7 s
against 67 s, an identical ``pip freeze``). It reads none of pip's configuration, which on this kind
of machine is where the CPU torch wheel is found (``find-links``) and the local mirrors are listed
(``extra-index-url``); without them ``torch==2.13.0`` would come from PyPI as a multi-GB CUDA build.
So pip's settings (``pip config list``: files and ``PIP_*`` variables) are handed to uv — index-url,
extra-index-url, find-links, constraint, cert — with pip's index strategy (the best version across
all indexes). Bytecode is not compiled (``make`` compiles on first import into ``.venv/pycache``).
If uv cannot be installed, or its install fails, pip installs instead and says so.
"""

from __future__ import annotations

import os
import subprocess
import sys

# pip setting -> uv option (one option per value)
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}


def pip_settings() -> dict[str, list[str]]:
    """pip's effective list-valued settings, e.g. ``{"find-links": ["/opt/wheels"], ...}`` (values deduplicated)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
    settings: dict[str, list[str]] = {}
    for line in listed.stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        name = key.rsplit(".", 1)[-1]
        for item in value.strip().strip("'\"").split():
            if item not in settings.setdefault(name, []):
                settings[name].append(item)
    return settings


def uv_command(requirement: list[str], settings: dict[str, list[str]]) -> list[str]:
    argv = [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable, "--quiet",
            "--index-strategy", "unsafe-best-match"]
    for name, option in OPTIONS.items():
        for value in settings.get(name, []):
            argv += [option, value]
    return argv + requirement


def main(requirement: list[str]) -> int:
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--disable-pip-version-check"]
    try:
        settings = pip_settings()
        subprocess.run([*pip, "uv"], check=True)
        env = dict(os.environ)
        if settings.get("cert") and "SSL_CERT_FILE" not in env:
            env["SSL_CERT_FILE"] = settings["cert"][-1]  # pip's CA bundle (a registry proxy's CA may be in it)
        subprocess.run(uv_command(requirement, settings), check=True, env=env)
        return 0
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"venv_install: uv did not install {' '.join(requirement)} ({exc}); installing with pip", file=sys.stderr)
    return subprocess.run([*pip, *requirement]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
