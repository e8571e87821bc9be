"""Shared fixtures: every test gets its own data root and an offline Hugging Face stack."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One OpenMP/MKL thread per process, set before anything imports torch, inherited by every process a test
# starts (Dagster run workers, trainers, model servers): `make test` runs three workers on two cores, and
# an OpenMP team whose threads outnumber the free cores spins at its barriers while one of them waits for
# a core (a served model answered ~10x slower beside one other busy process, burning CPU all the while).
# Numba's kernels keep their own pool (NUMBA_NUM_THREADS), and tests that time or size threads set theirs.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """A fresh, empty data root; ``$TRAINING_ASSETS_DATA`` points at it for the test."""
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv("TRAINING_ASSETS_DATA", str(root))
    return root


_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"


def pg_connect(db: str = "postgres"):
    import psycopg2

    return psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname=db, connect_timeout=3)


def postgres_unavailable_reason() -> str | None:
    try:
        pg_connect().close()
    except Exception as exc:  # any failure means: no server we can use
        return (f"PostgreSQL not reachable at {PG_USER}@{PG_HOST}:{PG_PORT} ({exc.__class__.__name__}: "
                f"{str(exc).strip()}); start it (.ci/run does) to run the production-path tests")
    return None


def _execute(statements: list[str]) -> None:
    conn = pg_connect()
    conn.autocommit = True
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
    conn.close()


@pytest.fixture(scope="session")
def postgres_databases():
    """``fresh(prefix, *suffixes)``: a context manager giving a new database name on the local
    PostgreSQL (and one more per suffix, ``name + suffix``), all dropped on exit; the test skips,
    saying why, when the server is not reachable."""
    import uuid
    from contextlib import contextmanager

    @contextmanager
    def fresh(prefix: str, *suffixes: str):
        reason = postgres_unavailable_reason()
        if reason:
            print(f"SKIP: {reason}")
            pytest.skip(reason)
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        names = [name, *(name + suffix for suffix in suffixes)]
        _execute([f'CREATE DATABASE "{n}"' for n in names])
        try:
            yield name
        finally:
            _execute([f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)' for n in names])

    return fresh


@pytest.fixture(scope="session")
def fake_vllm_lib():
    """``tests/fake_vllm.py`` as a module (``FakeVllm`` in-process, ``spawn`` as a process): test
    modules cannot import each other under importlib mode."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fake_vllm", os.path.join(_TESTS_DIR, "fake_vllm.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
# Folders whose session fixtures are expensive (a Dagster stack on PostgreSQL, trained tiny models,
# a materialised graph) are one unit of scheduling; elsewhere each file is one (tests/trainers' session
# fixtures, a tokenizer and a tiny base, cost seconds: its files spread). test_automation.py starts a
# stack of its own, so it is a unit apart from the rest of tests/deploy.
_WHOLE_FOLDERS = {"deploy", "evaluation", "datasets", "real_model"}  # real_model: one fetch of the real base
_OWN_UNITS = {"tests/deploy/test_automation.py"}
# started before every other unit: the longest one (~200 s of a ~430 s suite on a quiet machine,
# its own stack's daemon polling); xdist otherwise hands units out by test count, and this one, with
# three tests, started last and set the suite's end
_FIRST = {"tests/deploy/test_automation.py", "real_model"}  # real_model: the fetch, then a small loop (~3 min)


def _unit_of(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    parts = path.split("/")
    if path in _OWN_UNITS:
        return path
    if len(parts) > 2 and parts[1] in _WHOLE_FOLDERS:
        return parts[1]
    return path


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs ``-n N --dist loadgroup``: a folder with expensive session fixtures stays on
    one worker (they are built once, not once per worker), other files spread over the workers.
    (xdist's own ``xdist_group`` marks rename node ids, which this pytest no longer allows.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # The queue follows the workers' collection order (``pytest_collection_modifyitems``: the
    # automation unit, then xdist's own order by test count). Forcing every long unit first had
    # started the three server-heavy ones (automation, agent e2e, deploy) together, whose daemons
    # and code servers then shared the 2 cores: 23 min 50 s from a fresh clone against 21 min 43 s.
    config.option.loadscopereorder = False

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit_of(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """On the workers (whose collection order the scheduler's queue follows): ``_FIRST``, then units by
    their number of tests, most first, as xdist orders them; a unit's own order is kept."""
    if hasattr(config, "workerinput"):
        from collections import Counter

        counts = Counter(_unit_of(item.nodeid) for item in items)
        items.sort(key=lambda item: (_unit_of(item.nodeid) not in _FIRST, -counts[_unit_of(item.nodeid)]))
