"""Model Explorer shows fusionkit's fusions: ``fusionkit lower --model-explorer DIR``.

A tiny model with two RMSNorms on Vulkan: one whose weight is a parameter fuses into
``et_vk.rms_norm``; one whose weight is computed from a user input (``1.0 + s``) is
declined. The command writes the graphs Model Explorer's ETRecord adapter builds (before
and after the rules) and two node-data overlays; Model Explorer's own server serves them
(a child process, on a free port) to headless Chromium, which draws the graph and the
overlay's values and colours.

``FUSIONKIT_SCREENSHOT=docs/images/model-explorer.png`` also saves the page's screenshot
there (the one docs/devtools.md shows).
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.exir import to_edge

from fusionkit import (
    FusionPass,
    MatchResult,
    PrepackableConstant,
    Rule,
    capture,
    op,
    ref,
    replace_with,
)
from fusionkit.integration import model_explorer as me

AFTER, BEFORE = "edge_after_transform/forward", "forward"
FUSED, DECLINED = "et_vk_rms_norm_default_", "aten_mul_tensor_3_"  # Model Explorer's node ids
#: the nodes the fused RMSNorm replaced, graph order, the root last
REPLACED = ["aten_pow_tensor_scalar", "aten_mean_dim", "aten_add_tensor", "aten_rsqrt_default",
            "aten_mul_tensor", "aten_mul_tensor_1"]


class Norms(torch.nn.Module):
    """``rms(x) * w`` (w a parameter: fuses), then ``rms(.) * (1.0 + s)`` (s an input: declined)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(16, generator=torch.Generator().manual_seed(0)))

    @staticmethod
    def rms(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return self.rms(self.rms(x) * self.w) * (1.0 + s)


def _unavailable() -> str | None:
    """Why Model Explorer cannot run in a browser here, or None."""
    lacking = me.missing()
    if lacking:
        return f"{lacking} is not installed ({me.INSTALL})"
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        return "chromium and chromedriver are missing"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Model Explorer's server, as ``model_explorer.visualize_from_config`` starts it, for the
#: graphs and overlays named on the command line; no browser of its own, and no look-up of
#: a newer release on PyPI (a test reaches no network)
SERVE = """
import sys
import model_explorer
from model_explorer import server

server._check_new_version = lambda print_msg=True: {
    "version": "", "runningVersion": "", "releaseUrl": "", "desktopAppUrl": ""}
port, graphs, *overlays = sys.argv[1:]
config = model_explorer.config().add_model_from_path(graphs)
for overlay in overlays:
    config.add_node_data_from_path(overlay)
model_explorer.visualize_from_config(config, host="127.0.0.1", port=int(port),
                                     no_open_in_browser=True)
"""

#: ``fusionkit lower --model-explorer`` where Model Explorer cannot be imported
WITHOUT = """
import sys
sys.modules["model_explorer"] = None
from fusionkit.app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _fusionkit(cwd: Path, *args: str, python: str | None = None
               ) -> subprocess.CompletedProcess[str]:
    """The ``fusionkit`` command (or ``python``'s program given its arguments) run in ``cwd``."""
    exe = shutil.which("fusionkit")
    cmd = ([sys.executable, "-c", python] if python else [exe] if exe
           else [sys.executable, "-m", "fusionkit.app.cli"])
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def lowered(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The command's run and its files; Model Explorer's server starting meanwhile (it reads
    the files when the page asks for them), stopped at the end."""
    why = _unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(f"{why}: run scripts/bootstrap")
    d = tmp_path_factory.mktemp("model_explorer")
    ep = torch.export.export(Norms().eval(), (torch.randn(2, 16), torch.rand(16)))
    torch.export.save(ep, str(d / "norms.pt2"))
    out = d / "viewer"
    port = _free_port()
    log = open(d / "server.log", "w")  # closed at teardown
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(port), str(out / me.GRAPHS_FILE),
         str(out / me.VERDICTS_FILE), str(out / me.DETAILS_FILE)],
        stdout=log, stderr=subprocess.STDOUT, cwd=d, start_new_session=True)
    # relative paths, as a user types them (the ETRecord's path is one of the graph's attributes)
    argv = ("lower", "norms.pt2", "--backend", "vulkan", "-o", "norms.pte")
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            run = pool.submit(_fusionkit, d, *argv, "--model-explorer", "viewer", "--json")
            bare = pool.submit(_fusionkit, d, *argv[:-1], "unused.pte", "--model-explorer",
                               "unused", python=WITHOUT)
            yield {"run": run.result(), "without": bare.result(), "dir": out, "tmp": d,
                   "port": port, "server": server, "log": d / "server.log"}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


def test_lower_writes_the_graphs_and_an_overlay_of_what_fused_and_declined(lowered: Any) -> None:
    r: subprocess.CompletedProcess[str] = lowered["run"]
    assert r.returncode == 0, r.stderr
    out: Path = lowered["dir"]
    report = json.loads(r.stdout)
    assert report["model_explorer"] == {
        "directory": "viewer",
        "command": "model-explorer viewer/graphs.json "
                   "--node_data_paths=viewer/fusions.json,viewer/fusion_details.json"}
    assert sorted(p.name for p in out.iterdir()) == [
        "fusion_details.json", "fusions.json", "graphs.json", "norms.etrecord"]

    # the graphs: Model Explorer's ETRecord adapter's collection, before and after the rules
    collection = _read(out / "graphs.json")
    assert collection["label"] == "norms.etrecord"
    graphs = {g["id"]: g for g in collection["graphs"]}
    assert set(graphs) == {BEFORE, AFTER}
    labels = {n["id"]: n["label"] for n in graphs[AFTER]["nodes"]}
    assert labels[FUSED] == "et_vk::rms_norm"  # the fused op, drawn by its name
    assert labels[DECLINED] == "aten::mul"
    assert "et_vk::rms_norm" not in {n["label"] for n in graphs[BEFORE]["nodes"]}

    # the overlay: the fused node and the declined match's root, by their node ids
    verdicts, details = _read(out / "fusions.json"), _read(out / "fusion_details.json")
    assert set(verdicts) == set(details) == {BEFORE, AFTER}
    after = verdicts[AFTER]
    assert after["name"] == "fusionkit" and details[AFTER]["name"] == "fusionkit: details"
    assert after["results"] == {
        FUSED: {"value": "fused: rms_norm", "bgColor": me.COLOURS["fused"]},
        DECLINED: {"value": "declined: rms_norm", "bgColor": me.COLOURS["declined"]}}
    fused_detail = details[AFTER]["results"][FUSED]["value"]
    assert fused_detail == f"rms_norm fused: replaced 6 nodes: {', '.join(REPLACED)}"
    declined_detail = details[AFTER]["results"][DECLINED]["value"]
    assert declined_detail.startswith("rms_norm declined: prepackable_constant at aten_add_tensor_2: ")
    assert "computed in the graph" in declined_detail and "user input `s`" in declined_detail
    # before the rules: every node the fusion replaced, and the same declined root
    before = verdicts[BEFORE]["results"]
    assert {k for k, v in before.items() if v["value"] == "fused: rms_norm"} == \
        {f"{n}_" for n in REPLACED}
    assert before[DECLINED]["value"] == "declined: rms_norm"
    # every key is a node Model Explorer draws
    for gid, data in verdicts.items():
        assert set(data["results"]) <= {n["id"] for n in graphs[gid]["nodes"]}


def test_without_model_explorer_the_flag_fails_in_one_line(lowered: Any) -> None:
    r: subprocess.CompletedProcess[str] = lowered["without"]
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("fusionkit: error:")]
    assert "--model-explorer needs Model Explorer (ai-edge-model-explorer is not installed)" in line
    assert me.INSTALL in line
    assert not (lowered["tmp"] / "unused").exists() and not (lowered["tmp"] / "unused.pte").exists()


def test_marks_follow_the_report_onto_both_graphs() -> None:
    """Without Model Explorer: what each graph's nodes are marked with, by node name."""
    class Net(torch.nn.Module):  # mm + bias fuses; mm + an input is declined
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8))
            self.b = torch.nn.Parameter(torch.randn(8))

        def forward(self, x: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return torch.mm(x, self.w) + self.b, torch.mm(x, self.w) + e

    ep = to_edge(torch.export.export(Net().eval(), (torch.randn(4, 8), torch.randn(8)))
                 ).exported_program()
    before = copy.deepcopy(ep)
    addmm = Rule("addmm", op("aten.add.Tensor", op("aten.mm.default", capture("x"), capture("w")),
                             capture("b")),
                 replace_with("aten.addmm.default", ref("b"), ref("x"), ref("w")),
                 constraints=[PrepackableConstant("b")])
    p = FusionPass([addmm])
    p.call(ep)
    report = p.report
    mm_1 = next(n for n in before.graph.nodes if n.name == "aten_mm_default_1")
    report.declined.append(MatchResult.fail("planted", mm_1, "error", "replacement raised X: y"))

    got = me.marks(report, before=before, after=ep)
    simple = {g: {n: [(m.verdict, m.rule) for m in ms] for n, ms in per.items()}
              for g, per in got.items()}
    assert simple == {
        me.BEFORE_GRAPH_KEY: {"aten_mm_default": [("fused", "addmm")],
                              "aten_add_tensor": [("fused", "addmm")],
                              "aten_add_tensor_1": [("declined", "addmm")],
                              "aten_mm_default_1": [("error", "planted")]},
        AFTER: {"aten_addmm_default": [("fused", "addmm")],
                "aten_add_tensor_1": [("declined", "addmm")],
                "aten_mm_default_1": [("error", "planted")]}}
    after = got[AFTER]
    assert after["aten_addmm_default"][0].detail == \
        "replaced 2 nodes: aten_mm_default, aten_add_tensor"
    assert after["aten_add_tensor_1"][0].detail.startswith("prepackable_constant at e: ")
    assert got[me.BEFORE_GRAPH_KEY]["aten_mm_default"][0].detail == \
        "match at aten_add_tensor, 2 nodes fused into one: aten_mm_default, aten_add_tensor"
    assert me.marks(report) == {}


# ----------------------------------------------------------------- in a real browser


@pytest.fixture(scope="module")
def browser(lowered: Any) -> Any:
    """Headless Chromium driven through chromedriver (both installed by scripts/bootstrap)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or ""
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1400,860",
                 f"--user-data-dir={tempfile.mkdtemp(prefix='fusionkit-chromium-')}"):
        opts.add_argument(flag)
    d = webdriver.Chrome(service=Service(shutil.which("chromedriver") or ""), options=opts)
    yield d
    d.quit()


def _wait_for_server(lowered: Any, seconds: float = 90) -> str:
    url = f"http://127.0.0.1:{lowered['port']}"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if lowered["server"].poll() is not None:
            pytest.fail(f"Model Explorer's server exited: {lowered['log'].read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/check_health", timeout=2) as resp:
                if resp.read() == b"model_explorer_ok":
                    return url
        except OSError:
            time.sleep(0.25)
    pytest.fail(f"Model Explorer's server did not answer: {lowered['log'].read_text()[-2000:]}")


def _page(url: str, out: Path) -> str:
    """Model Explorer's page for the graphs and both overlays, the graph after the rules open
    (the ``data`` parameter its server builds, with the UI state its links carry)."""
    data = {"models": [{"url": str(out / me.GRAPHS_FILE)}],
            "nodeData": [str(out / me.VERDICTS_FILE), str(out / me.DETAILS_FILE)],
            "nodeDataTargets": ["", ""],
            "uiState": {"paneStates": [{"deepestExpandedGroupNodeIds": [], "selectedNodeId": "",
                                        "selectedGraphId": AFTER,
                                        "selectedCollectionLabel": "norms.etrecord",
                                        "widthFraction": 1}]}}
    return f"{url}/?data={urllib.parse.quote(json.dumps(data))}"


#: what the graph renderer holds once the graph and both overlays are in (Model Explorer
#: registers its renderers on ``window.me_test``)
_RENDERED = """
const r = window.me_test && window.me_test.renderers[0];
const g = r && r.curModelGraph;
if (!g) return null;
const runs = Object.values(r.curNodeDataProviderRuns || {}).filter(x => x.done);
return {graph: g.id, labels: Object.fromEntries(g.nodes.map(n => [n.id, n.label])),
        drawn: (r.nodesToRender || []).map(x => x.node.id),
        runs: runs.map(x => x.results ? x.results[g.id] || {} : {})};
"""

#: the side panel's "Node data" table: the overlays' names, and per row the node's label and
#: each overlay's value with its background colour
_TABLE = """
const t = document.querySelector('.table-container.results table.results');
if (!t) return null;
return {columns: [...t.querySelectorAll('thead .stat-label')].map(e => e.textContent.trim()),
        rows: [...t.querySelectorAll('tbody tr')].map(tr => {
          const cells = [...tr.querySelectorAll('td')];
          return {label: cells[1].textContent.trim(),
                  values: cells.slice(2).map(c => [c.textContent.trim(),
                                                   getComputedStyle(c).backgroundColor])}; })};
"""


def _poll(browser: Any, script: str, ready: Any, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    got = None
    while time.monotonic() < deadline:
        got = browser.execute_script(script)
        if got is not None and ready(got):
            return got
        time.sleep(0.25)
    pytest.fail(f"Model Explorer's page did not get there: {got}")


def _rgb(colour: str) -> tuple[int, int, int]:
    return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))


def test_model_explorer_draws_the_graph_and_the_overlay_in_a_browser(
        lowered: Any, browser: Any) -> None:
    assert lowered["run"].returncode == 0, lowered["run"].stderr
    browser.get(_page(_wait_for_server(lowered), lowered["dir"]))

    # the graph after the rules, both overlays loaded for it; every layer expanded, its
    # nodes laid out
    _poll(browser, _RENDERED, lambda s: len(s["runs"]) == 2)
    browser.find_element("css selector", ".toolbar-icon.expand-all").click()
    state = _poll(browser, _RENDERED, lambda s: FUSED in s["drawn"])
    assert state["graph"] == AFTER
    assert state["labels"][FUSED] == "et_vk::rms_norm" and state["labels"][DECLINED] == "aten::mul"
    assert {FUSED, DECLINED} <= set(state["drawn"])
    values = sorted(({k: v["value"] for k, v in run.items()} for run in state["runs"]),
                    key=lambda run: len(run[FUSED]))
    assert values[0] == {FUSED: "fused: rms_norm", DECLINED: "declined: rms_norm"}
    assert "prepackable_constant" in values[1][DECLINED]

    # the side panel's table: each overlay a column, the two nodes' values in their colours
    table = _poll(browser, _TABLE, lambda t: any(r["values"] and r["values"][0][0] != "-"
                                                 for r in t["rows"]))
    assert table["columns"] == ["fusionkit", "fusionkit: details"]
    marked = {r["label"]: r["values"] for r in table["rows"] if r["values"][0][0] != "-"}
    green, amber = ("rgb({}, {}, {})".format(*_rgb(me.COLOURS[v])) for v in ("fused", "declined"))
    assert marked["et_vk::rms_norm"][0] == ["fused: rms_norm", green]
    assert marked["et_vk::rms_norm"][1][0].startswith("rms_norm fused: replaced 6 nodes:")
    assert marked["aten::mul"][0] == ["declined: rms_norm", amber]
    assert "cannot be folded because it depends on a user input `s`" in marked["aten::mul"][1][0]

    # for the picture: a wider side panel (its resizer dragged), the table filtered to the
    # fused op and the muls, the pointer off the toolbar (no tooltip)
    from selenium.webdriver.common.action_chains import ActionChains

    resizer = browser.find_element("css selector", ".resizer")
    ActionChains(browser).click_and_hold(resizer).move_by_offset(-260, 0).release().perform()
    field = browser.find_element("css selector", ".table-container.results .node-filter input")
    field.send_keys("rms_norm|aten::mul")
    _poll(browser, _TABLE, lambda t: len(t["rows"]) == 3)
    body = browser.find_element("css selector", "body")
    ActionChains(browser).move_to_element_with_offset(body, 0, 0).perform()
    time.sleep(0.5)  # a frame or two
    png = browser.get_screenshot_as_png()
    (lowered["tmp"] / "model-explorer.png").write_bytes(png)
    if os.environ.get("FUSIONKIT_SCREENSHOT"):
        Path(os.environ["FUSIONKIT_SCREENSHOT"]).write_bytes(_small_png(png))

    # the canvas, left of the side panel, drew the two nodes in the overlay's colours
    from PIL import Image

    panel = browser.execute_script(
        "return document.querySelector('info-panel').getBoundingClientRect().left")
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert 600 < panel < image.width
    graph_area = image.crop((0, 0, int(panel), image.height))
    counts = dict.fromkeys(("fused", "declined"), 0)
    for count, pixel in graph_area.getcolors(maxcolors=1 << 22) or []:
        for verdict in counts:
            if pixel == _rgb(me.COLOURS[verdict]):
                counts[verdict] += count
    assert counts["fused"] > 200 and counts["declined"] > 200, counts


def _small_png(png: bytes) -> bytes:
    """The screenshot as a palette PNG (docs/images/ stays small)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=64)
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return buf.getvalue()
