"""The production stack without containers: Postgres-backed Dagster (code server, webserver,
daemon) and an MLflow server, all bound to 127.0.0.1 on free ports, using deploy/dagster.yaml (its
run-monitoring timeouts shortened) and deploy/workspace.yaml as the compose file does.

One stack per test session (starting it costs ~20 s); every process runs in its own process
group under a hard deadline and is killed at the end, pass or fail. A fresh database per run is
created on the local PostgreSQL (127.0.0.1:5432, user postgres) and dropped afterwards.
"""

import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"
STACK_DEADLINE_S = 900  # no process of the stack outlives this, even if teardown never runs
LOCATION = "training_assets"


# run_monitoring timings of deploy/dagster.yaml, shortened for the tests: a run the killed daemon had
# dequeued but not started sits in STARTING until monitoring fails it (then run_retries relaunches it).
# Production waits 300 s for a slow container start, polling every 30 s; here a start takes seconds,
# and the daemon-crash tests waited up to 330 s whenever the SIGKILL fell between dequeue and launch.
TEST_RUN_MONITORING = {"start_timeout_seconds": 60, "poll_interval_seconds": 5}


def write_instance_config(path: Path) -> None:
    """deploy/dagster.yaml as the compose file uses it, with ``TEST_RUN_MONITORING``'s timings."""
    import yaml

    config = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())
    config["run_monitoring"].update(TEST_RUN_MONITORING)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process in its own session (so the whole tree can be killed), logging to a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path,
                 deadline_s: int = STACK_DEADLINE_S):
        self.name = name
        self.log = log_dir / f"{name}.log"
        # `timeout` is the backstop: the process dies after STACK_DEADLINE_S whatever happens here
        self.popen = subprocess.Popen(
            ["timeout", "-s", "KILL", str(deadline_s), *argv], env=env, cwd=REPO,
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, wait_s: float = 10) -> None:
        """Signal the process group, wait up to ``wait_s``, then SIGKILL the group: helpers
        that outlive their parent (gRPC servers, run workers) go too."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
                self.popen.wait(timeout=wait_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=10)

    def tail(self, n: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


class GraphQLError(AssertionError):
    pass


class Stack:
    """Handles on the running stack. Tests talk to Dagster only through ``graphql``."""

    def __init__(self, tmp: Path, db: str, deadline_s: int = STACK_DEADLINE_S):
        self.tmp = tmp
        self.deadline_s = deadline_s
        self.db = db
        self.data = tmp / "data"
        self.inbox = self.data / "inbox"
        self.home = tmp / "dagster_home"
        self.logs = tmp / "logs"
        for d in (self.data, self.inbox, self.home, self.logs, tmp / "storage", tmp / "mlartifacts"):
            d.mkdir(parents=True, exist_ok=True)
        write_instance_config(self.home / "dagster.yaml")
        self.code_port, self.web_port, self.mlflow_port = free_port(), free_port(), free_port()
        self.web_url = f"http://127.0.0.1:{self.web_port}"
        self.mlflow_url = f"http://127.0.0.1:{self.mlflow_port}"
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(self.home),
            "DAGSTER_PG_HOST": PG_HOST, "DAGSTER_PG_PORT": str(PG_PORT), "DAGSTER_PG_DB": db,
            "DAGSTER_PG_USER": PG_USER, "DAGSTER_PG_PASSWORD": "",
            "DAGSTER_DEQUEUE_INTERVAL_SECONDS": "1",
            "DAGSTER_STORAGE_DIR": str(tmp / "storage"),
            "DAGSTER_CODE_HOST": "127.0.0.1", "DAGSTER_CODE_PORT": str(self.code_port),
            "TRAINING_ASSETS_DATA": str(self.data),
            "TRAINING_ASSETS_SENSOR_INTERVAL_S": "2",  # honoured once sensors.py reads it (see docs)
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "DAGSTER_TELEMETRY_DISABLED": "1", "PYTHONUNBUFFERED": "1",
        }
        self.procs: dict[str, Proc] = {}
        self.session = requests.Session()

    # ------------------------------------------------------------------ processes
    def start(self, name: str) -> Proc:
        workspace = str(REPO / "deploy" / "workspace.yaml")
        argv = {
            "code-server": [str(BIN / "dagster"), "code-server", "start", "-m", "training_assets.definitions",
                            "-h", "127.0.0.1", "-p", str(self.code_port), "--location-name", LOCATION],
            "webserver": [str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(self.web_port),
                          "-w", workspace],
            "daemon": [str(BIN / "dagster-daemon"), "run", "-w", workspace],
            "mlflow": [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.mlflow_port),
                       "--workers", "1",
                       "--backend-store-uri", f"postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.db}_mlflow",
                       "--artifacts-destination", str(self.tmp / "mlartifacts"),
                       "--allowed-hosts", f"127.0.0.1:{self.mlflow_port},localhost:{self.mlflow_port},mlflow:5000"],
        }[name]
        # MLflow 3's server starts huey job consumers (GenAI scorer jobs, trace roll-ups) that the
        # registry never uses: measured 89 s of CPU over one suite; off, as in docker-compose.yml
        env = {**self.env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"} if name == "mlflow" else self.env
        proc = Proc(name, argv, env, self.logs, self.deadline_s)
        self.procs[name] = proc
        return proc

    def stop_all(self) -> None:
        """SIGTERM every process group at once, then wait (SIGKILL whatever is left after 10 s)."""
        procs = [p for p in self.procs.values() if p.alive()]
        for proc in procs:
            try:
                os.killpg(proc.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for proc in procs:
            proc.stop(wait_s=max(0.1, deadline - time.monotonic()))

    def diagnostics(self) -> str:
        return "\n".join(f"--- {p.name} (alive={p.alive()}) ---\n{p.tail()}" for p in self.procs.values())

    def wait_for(self, what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.5) -> Any:
        """Poll ``check`` until it returns a truthy value; fail with the processes' logs otherwise."""
        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            dead = [p.name for p in self.procs.values() if not p.alive()]
            if dead:
                pytest.fail(f"{what}: process(es) {dead} exited\n{self.diagnostics()}")
            try:
                value = check()
                if value:
                    return value
            except (requests.RequestException, GraphQLError) as exc:
                last_error = exc
            time.sleep(every_s)
        pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what} (last error: {last_error})\n"
                    f"{self.diagnostics()}")

    # ------------------------------------------------------------------ GraphQL
    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        response = self.session.post(f"{self.web_url}/graphql", json={"query": query, "variables": variables},
                                     timeout=30)
        response.raise_for_status()
        body = response.json()
        if body.get("errors"):
            raise GraphQLError(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def repository_loaded(self) -> bool:
        data = self.graphql("""{ workspaceOrError { ... on Workspace { locationEntries {
            name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }""")
        entries = {e["name"]: e for e in data["workspaceOrError"]["locationEntries"]}
        entry = entries.get(LOCATION)
        if entry and entry["locationOrLoadError"]["__typename"] == "PythonError":
            message = entry["locationOrLoadError"]["message"]
            if "UserCodeUnreachable" not in message:
                pytest.fail(f"code location failed to load: {message}")
            # the code server is still importing the definitions: ask the webserver to reconnect
            self.graphql("""mutation($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) {
                __typename } }""", name=LOCATION)
            return False
        return bool(entry and entry["loadStatus"] == "LOADED"
                    and entry["locationOrLoadError"]["__typename"] == "RepositoryLocation")

    def daemon_healthy(self) -> bool:
        data = self.graphql("""{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }""")
        statuses = data["instance"]["daemonHealth"]["allDaemonStatuses"]
        needed = {"SENSOR", "QUEUED_RUN_COORDINATOR", "BACKFILL"}
        return all(s["healthy"] for s in statuses if s["daemonType"] in needed and s["required"])

    def materializations(self, asset: str) -> list[dict[str, Any]]:
        data = self.graphql("""query($key: AssetKeyInput!) { assetOrError(assetKey: $key) {
              __typename ... on Asset { assetMaterializations(limit: 10000) { partition runId
                metadataEntries { label ... on IntMetadataEntry { intValue } } } } } }""",
                            key={"path": [asset]})
        node = data["assetOrError"]
        return node["assetMaterializations"] if node["__typename"] == "Asset" else []

    def runs(self, tags: list[dict[str, str]] | None = None) -> list[dict[str, Any]]:
        data = self.graphql("""query($filter: RunsFilter) { runsOrError(filter: $filter, limit: 1000) {
              __typename ... on Runs { results { runId status tags { key value } } }
              ... on PythonError { message } } }""", filter={"tags": tags or []})
        result = data["runsOrError"]
        if result["__typename"] != "Runs":
            raise GraphQLError(str(result))
        return [{**r, "tags": {t["key"]: t["value"] for t in r["tags"]}} for r in result["results"]]

    def runs_settled(self) -> bool:
        busy = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "MANAGED", "CANCELING"}
        return not [r for r in self.runs() if r["status"] in busy]


@contextmanager
def running_stack(databases: Callable[..., Any], tmp: Path, env: dict[str, str] | None = None, mlflow: bool = True,
                  deadline_s: int = STACK_DEADLINE_S) -> Iterator[Stack]:
    """A fresh database pair (``databases``: the ``postgres_databases`` fixture) and the stack's
    processes (``env`` overrides the stack's environment; ``mlflow=False``: no MLflow server, the
    code location uses its SQLite store under the data root)."""
    with databases("ta_deploy", "_mlflow") as db:
        yield from _stack_processes(Stack(tmp, db, deadline_s), env, mlflow)


def _stack_processes(s: Stack, env: dict[str, str] | None, mlflow: bool) -> Iterator[Stack]:
    s.env.update(env or {})
    if not mlflow:
        s.env.pop("MLFLOW_TRACKING_URI")
    try:
        if mlflow:
            s.start("mlflow")
        s.start("code-server")
        # Create the schema once before the webserver and daemon connect: two processes migrating a
        # fresh database at the same moment race (compose does the same with its `migrate` service).
        migrate = subprocess.run([str(BIN / "dagster"), "instance", "migrate"], env=s.env, cwd=REPO,
                                 capture_output=True, text=True, timeout=120)
        assert migrate.returncode == 0, f"dagster instance migrate failed:\n{migrate.stdout}\n{migrate.stderr}"
        s.start("webserver")
        s.start("daemon")
        s.wait_for("the webserver to load the code location", s.repository_loaded, timeout_s=120, every_s=1)
        s.wait_for("the daemon's heartbeats", s.daemon_healthy, timeout_s=60, every_s=1)
        yield s
    finally:
        s.stop_all()


@pytest.fixture(scope="session")
def stack(tmp_path_factory, postgres_databases) -> Iterator[Stack]:
    # These tests launch runs by hand (sensor, backfills): the automation sensor stays stopped here;
    # test_automation.py starts a stack of its own with it running.
    with running_stack(postgres_databases, tmp_path_factory.mktemp("deploy"),
                       {"TRAINING_ASSETS_AUTOMATION": "stopped"}) as s:
        yield s


@pytest.fixture(scope="session")
def make_stack(postgres_databases) -> Callable[..., Any]:
    """``running_stack`` for a module that needs a stack of its own (its own database and data root)."""
    return functools.partial(running_stack, postgres_databases)
