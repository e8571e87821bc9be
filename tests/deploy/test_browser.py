"""The UI in a real browser: headless Chromium, driven over the DevTools protocol, renders the
asset graph, an asset's page, and the loss-curve plot in a checkpoint's materialisation metadata,
from the production stack (the ``stack`` fixture in conftest.py).

Screenshots land in ``$TRAINING_ASSETS_SCREENSHOTS`` (default: the test's temp folder); the
pictures in docs/img/ were made this way.
"""

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

pytestmark = [pytest.mark.postgres, pytest.mark.browser, pytest.mark.timeout(300)]

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BROWSER_DEADLINE_S = 300  # the browser dies after this whatever happens to the test


def find_chromium() -> str:
    for candidate in CHROMIUM_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    reason = "headless Chromium not found (Debian: apt-get install -y chromium; .ci/run tries)"
    print(f"SKIP: {reason}")
    pytest.skip(reason)


class Browser:
    """One headless Chromium page, driven through the Chrome DevTools Protocol."""

    def __init__(self, executable: str):
        from websockets.sync.client import connect

        self.profile = Path(tempfile.mkdtemp(prefix="chromium-"))
        self.log = self.profile / "chromium.log"
        self.proc = subprocess.Popen(
            ["timeout", "-s", "KILL", str(BROWSER_DEADLINE_S), executable, "--headless", "--no-sandbox",
             "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={self.profile}",
             "--window-size=1920,1200", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=self.log.open("wb"), start_new_session=True)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise AssertionError(f"Chromium did not start: {self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        page = next(t for t in requests.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
                    if t["type"] == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self.next_id = 0
        self.call("Page.enable")

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # skip protocol events until our answer arrives
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_until(self, what: str, expression: str, timeout_s: float = 60):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.5)
        text = self.evaluate("document.body ? document.body.innerText : ''") or ""
        raise AssertionError(f"timed out waiting for {what}; the page says:\n{text[:3000]}")

    def goto(self, url: str, ready_text: str) -> str:
        """Open ``url`` and wait until the rendered page shows ``ready_text``; return the page text."""
        self.call("Page.navigate", url=url)
        self.wait_until(f"{url} to show {ready_text!r}",
                        f"document.body && document.body.innerText.includes({json.dumps(ready_text)})")
        # the first-visit "Join the Dagster community" dialog, if the instance did not disable it
        self.evaluate("""[...document.querySelectorAll('button')].filter(b => b.innerText.trim() === 'Skip')
                         .forEach(b => b.click())""")
        return self.evaluate("document.body.innerText")

    def screenshot(self, path: Path) -> None:
        time.sleep(1.0)  # let layout animations settle
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        assert data[:8] == PNG_MAGIC
        path.write_bytes(data)

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    executable = find_chromium()
    try:
        import websockets.sync.client  # noqa: F401  (comes with dagster-webserver's uvicorn[standard])
    except ImportError as exc:
        reason = f"the DevTools client needs the `websockets` package ({exc}); pip install websockets"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    b = Browser(executable)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    target = os.environ.get("TRAINING_ASSETS_SCREENSHOTS")
    folder = Path(target) if target else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# A label the graph shortens in the middle ("agentic_ev…_report") still names its asset.
SHOWN = """(name => document.body.innerText.includes(name) || document.body.innerText.split("\\n").some(line => {
  const parts = line.trim().split("\u2026");
  return parts.length === 2 && parts[0].length > 0 && name.length > parts[0].length + parts[1].length
         && name.startsWith(parts[0]) && name.endsWith(parts[1]);
}))"""


def not_shown(browser, names) -> list[str]:
    return browser.evaluate(f"{json.dumps(sorted(set(names)))}.filter(name => !{SHOWN}(name))")


def wait_shown(browser, what: str, names, timeout_s: float = 60) -> None:
    """Wait until the rendered page shows every one of ``names``, whole or shortened; name the missing."""
    deadline = time.monotonic() + timeout_s
    while (missing := not_shown(browser, names)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if missing:
        text = browser.evaluate("document.body ? document.body.innerText : ''") or ""
        raise AssertionError(f"timed out waiting for {what}: not shown {missing}; the page says:\n{text[:3000]}")


def asset_groups(stack) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for node in stack.graphql("{ assetNodes { assetKey { path } groupName } }")["assetNodes"]:
        groups.setdefault(node["groupName"], []).append("/".join(node["assetKey"]["path"]))
    return groups


def test_asset_graph_shows_every_group_and_asset(stack, browser, shots):
    groups = asset_groups(stack)
    assert "raw_traces" in groups["traces"]
    text = browser.goto(f"{stack.web_url}/asset-groups", "Global asset lineage")
    assert "Join the Dagster community" not in text
    wait_shown(browser, "every asset group in the global graph", groups)
    # the graph starts with groups collapsed; Alt+E ("Expand all groups") shows every asset
    for kind in ("keyDown", "keyUp"):
        browser.call("Input.dispatchKeyEvent", type=kind, modifiers=1, key="e", code="KeyE", windowsVirtualKeyCode=69)
    assets = [k for keys in groups.values() for k in keys]
    # the graph draws only the nodes inside its viewport: zoom out (its own button) until all are in view
    for _ in range(6):
        time.sleep(1.0)
        if not not_shown(browser, assets):
            break
        browser.evaluate("""[...document.querySelectorAll('button')]
                            .find(b => b.querySelector('[aria-label="zoom_out"]')).click()""")
    wait_shown(browser, "every asset in the expanded graph", assets)
    browser.screenshot(shots / "asset_graph.png")


def test_asset_page_shows_description_partitions_and_lineage(stack, browser, shots):
    text = browser.goto(f"{stack.web_url}/assets/raw_traces", "Validated traces of one inbox batch")
    nodes = {"/".join(n["assetKey"]["path"]): n for n in stack.graphql(
        "{ assetNodes { assetKey { path } dependedByKeys { path } } }")["assetNodes"]}
    downstream = ["/".join(k["path"]) for k in nodes["raw_traces"]["dependedByKeys"]]
    assert downstream, "raw_traces has no downstream assets"
    wait_shown(browser, "the downstream assets in the lineage panel", downstream)
    text = browser.evaluate("document.body.innerText")
    assert "Partitions" in text and "trace_batch_sensor" in text and "Parquet" in text
    browser.screenshot(shots / "asset_raw_traces.png")


def test_loss_curve_renders_in_a_checkpoint_assets_metadata(stack, browser, shots, monkeypatch):
    import dagster as dg

    from training_assets.defs.metadata import png_markdown
    from training_assets.tracking import loss_curve_png

    # A base_checkpoint materialisation carrying the loss-curve entry exactly as the trainer asset
    # builds it (png_markdown(loss_curve_png(...), "loss curve")), reported into the stack's
    # Postgres instance: training the real chain up to it does not fit this test's time budget.
    for key, value in stack.env.items():
        if key.startswith(("DAGSTER_", "TRAINING_ASSETS_")):
            monkeypatch.setenv(key, value)
    losses = [4.2 * 0.93 ** step + 1.1 for step in range(40)]
    with dg.DagsterInstance.get() as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key="base_checkpoint",
            metadata={"loss_curve": png_markdown(loss_curve_png(losses, "base_checkpoint"), "loss curve"),
                      "final_loss": losses[-1]},
        ))
    browser.goto(f"{stack.web_url}/assets/base_checkpoint", "loss_curve")
    # Markdown metadata opens in a dialog from the metadata table
    browser.wait_until("the loss_curve entry's Markdown link", """(() => {
        const row = [...document.querySelectorAll('tr')].find(r => r.innerText.trim().startsWith('loss_curve'));
        const link = row && [...row.querySelectorAll('a, button')].find(e => e.innerText.trim() === '[Show Markdown]');
        if (link) { link.click(); return true; }
        return false; })()""")
    size = browser.wait_until("the loss-curve image to decode", """(() => {
        const img = [...document.querySelectorAll('img')].find(i => i.alt === 'loss curve'
            && i.src.startsWith('data:image/png;base64,'));
        return img && img.complete && img.naturalWidth > 0 ? [img.naturalWidth, img.naturalHeight] : null; })()""")
    assert size[0] > 100 and size[1] > 100, size
    browser.screenshot(shots / "loss_curve.png")
