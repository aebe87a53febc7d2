""""Why not here?" (``fusionkit.authoring.near_miss``, ``find_matches(all_near_misses=True)``) and
``fusionkit explain --rule R --at NODE`` / ``--all-near-misses``.

The issue's case: a two-op rule ``add(mm(x, w), b)`` on ``bmm(a, w) + b`` was
silent (a structural near miss is reported only past a progress threshold).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fusionkit import (
    PrepackableConstant,
    Rule,
    capture,
    find_matches,
    op,
    ref,
    replace_with,
    why_not,
)


def addmm_rule() -> Rule:
    return Rule("addmm", op("aten.add.Tensor", op("aten.mm.default", capture("x"), capture("w")),
                            capture("b")),
                replace_with("aten.addmm.default", ref("b"), ref("x"), ref("w")),
                constraints=[PrepackableConstant("b")])


class Mixed(nn.Module):
    """``mm + bias`` (fuses), ``bmm + bias`` (not an mm), ``mm + input`` (bias not constant)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.bias = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor, a: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, ...]:
        fused = torch.mm(x, self.w) + self.bias
        batched = torch.bmm(a, self.w.expand(2, 8, 8)) + self.bias
        computed = torch.mm(x, self.w) + e
        return fused, batched, computed


ARGS = (torch.randn(4, 8), torch.randn(2, 4, 8), torch.randn(8))


@pytest.fixture(scope="module")
def program() -> Any:
    from executorch.exir import to_edge

    ep = torch.export.export(Mixed().eval(), ARGS)
    return ep, to_edge(ep).exported_program()


def _add_of(ep: Any, producer: str) -> str:
    for n in ep.graph.nodes:
        if n.op == "call_function" and "add" in n.name and producer in n.args[0].name:
            return str(n.name)
    raise AssertionError(producer)


def test_a_small_rule_near_miss_is_silent_by_default_and_reported_when_asked(program: Any) -> None:
    _, edge = program
    default = find_matches(edge, [addmm_rule()])
    assert len(default.accepted) == 1
    assert all(d.step != "structure" for d in default.declined)  # the bmm miss is silent
    everything = find_matches(edge, [addmm_rule()], all_near_misses=True)
    (miss,) = [d for d in everything.declined if d.step == "structure"]
    assert miss.root.name == _add_of(edge, "bmm")
    assert miss.node is not None and "bmm" in miss.node.name
    assert "expected aten.mm.default" in miss.reason and "aten.bmm.default" in miss.reason
    assert miss.claimed == (miss.root,)  # the add matched, then its operand failed
    # lifting the threshold only adds reports: the accepted matches are the same
    assert [m.root for m in everything.accepted] == [m.root for m in default.accepted]


def test_why_not_names_the_step_the_expectation_and_what_was_found(program: Any) -> None:
    _, edge = program
    rule = addmm_rule()
    w = why_not(edge, rule, _add_of(edge, "bmm"))
    assert (w.status, w.step) == ("declined", "structure")
    assert w.node is not None and "bmm" in w.node.name
    assert "expected aten.mm.default" in w.reason and "got" in w.reason

    fused = why_not(edge, rule, _add_of(edge, "mm_default"))
    assert fused.status == "fused" and len(fused.claimed) == 2

    bias = why_not(edge, rule, _add_of(edge, "mm_default_1"))
    assert (bias.status, bias.step) == ("declined", "prepackable_constant")
    assert bias.node is not None and bias.node.name == "e" and "not a constant" in bias.reason
    assert {n.name for n in bias.claimed} >= {bias.root.name}

    mm = next(n for n in edge.graph.nodes if n.name == "aten_mm_default")
    inside = why_not(edge, rule, mm)
    assert inside.status == "inside" and "addmm" in inside.reason

    relu_rule = Rule("relu_mm", op("aten.relu.default", op("aten.mm.default", capture("x"),
                                                            capture("w"))),
                     replace_with("aten.mm.default", ref("x"), ref("w")))
    not_root = why_not(edge, relu_rule, mm)
    assert not_root.status == "not_root" and "aten.relu.default" in not_root.reason

    with pytest.raises(KeyError, match="no node named"):
        why_not(edge, rule, "aten_add")


# ------------------------------------------------------------------------ the command


@pytest.fixture(scope="module")
def cli_runs(program: Any, tmp_path_factory: Any) -> dict[str, Any]:
    from test_cli import run_concurrently

    from fusionkit.specs import rules_to_yaml

    ep, edge = program
    d = tmp_path_factory.mktemp("explain")
    torch.export.save(ep, str(d / "mixed.pt2"))
    (d / "addmm.yaml").write_text(rules_to_yaml([addmm_rule()]))
    html, html_all = d / "why.html", d / "all.html"
    base = ("explain", str(d / "mixed.pt2"), "--backend", "xnnpack", "--spec", str(d / "addmm.yaml"))
    at, near = run_concurrently(
        (*base, "--rule", "addmm", "--at", _add_of(edge, "bmm"), "--html", str(html)),
        (*base, "--all-near-misses", "--json", "--html", str(html_all)))
    return {"at": at, "near": near, "html": html, "html_all": html_all, "edge": edge}


def test_explain_rule_at_node_prints_the_verdict(cli_runs: dict[str, Any]) -> None:
    r: subprocess.CompletedProcess[str] = cli_runs["at"]
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"addmm at `{_add_of(cli_runs['edge'], 'bmm')}`: declined here"
    assert "step:   structure" in r.stdout
    assert "expected aten.mm.default" in r.stdout and "aten.bmm.default" in r.stdout
    assert Path(cli_runs["html"]).stat().st_size > 0


def test_explain_all_near_misses_reports_the_two_op_miss(cli_runs: dict[str, Any]) -> None:
    r: subprocess.CompletedProcess[str] = cli_runs["near"]
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    declined = [d for d in data["declined"] if d["rule"] == "addmm"]
    assert {d["step"] for d in declined} == {"structure", "prepackable_constant"}
    assert [a["rule"] for a in data["accepted"]].count("addmm") == 1


def test_explain_usage_mistakes_exit_2_in_one_line(program: Any) -> None:
    from test_cli import fusionkit_cmd

    r = fusionkit_cmd("explain", "fusionkit.app.demo_model:demo_factory", "--at", "aten_mm_default")
    assert r.returncode == 2 and "--at needs --rule" in r.stderr
    assert "Traceback" not in r.stderr
    r = fusionkit_cmd("explain", "fusionkit.app.demo_model:demo_factory", "--rule", "rms_nrom")
    assert r.returncode == 2 and "no such rule; did you mean rms_norm?" in r.stderr
    assert "Traceback" not in r.stderr


# ---------------------------------------------------------------- the page, in a browser


@pytest.fixture(scope="module")
def browser() -> Any:
    """Headless Chromium driven through chromedriver (both installed by scripts/bootstrap)."""
    import shutil
    import tempfile

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "chromium and chromedriver missing: run scripts/bootstrap"
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1200,1600",
                 f"--user-data-dir={tempfile.mkdtemp(prefix='fusionkit-chromium-')}"):
        opts.add_argument(flag)
    d = webdriver.Chrome(service=Service(driver), options=opts)
    yield d
    d.quit()


_DRAWINGS = """return [...document.querySelectorAll('section.match')].map(s => {
  const svg = s.querySelector('svg'); const r = svg ? svg.getBoundingClientRect() : null;
  return {rule: s.dataset.rule, verdict: s.dataset.verdict, root: s.dataset.root,
          w: r ? r.width : 0, h: r ? r.height : 0,
          nodes: [...s.querySelectorAll('svg g.node')].map(g => ({
             id: g.id, text: g.textContent.trim(),
             fill: (g.querySelector('path,polygon') || {getAttribute: () => ''}).getAttribute('fill'),
             w: g.getBoundingClientRect().width})),
          caption: s.querySelector('figcaption').innerText}; });"""


def test_html_page_draws_each_match_in_a_real_browser(cli_runs: dict[str, Any], browser: Any) -> None:
    page = Path(cli_runs["html_all"])
    text = page.read_text()
    # self-contained: no script, no stylesheet or image fetched from anywhere
    assert "<script" not in text and "<link" not in text and "src=" not in text
    browser.get(page.as_uri())
    drawings = browser.execute_script(_DRAWINGS)
    data = json.loads(cli_runs["near"].stdout)
    assert len(drawings) == len(data["accepted"]) + len(data["declined"])
    for dr in drawings:
        assert dr["w"] > 50 and dr["h"] > 50, dr  # the SVG rendered with a real size
        assert dr["nodes"] and all(n["w"] > 0 for n in dr["nodes"])
        assert dr["root"] in " ".join(n["text"] for n in dr["nodes"])
    edge = cli_runs["edge"]
    bmm_add = _add_of(edge, "bmm")
    (miss,) = [d for d in drawings if d["rule"] == "addmm" and d["root"] == bmm_add]
    assert miss["verdict"] == "declined"
    assert "expected aten.mm.default" in miss["caption"]
    fault = [n for n in miss["nodes"] if "bmm" in n["id"] and "aten_bmm_default" in n["text"]]
    assert fault and fault[0]["fill"] == "#ff6b6b"  # the node at fault, marked
    root = [n for n in miss["nodes"] if n["id"].endswith(f"node-{bmm_add}")]
    assert root and root[0]["fill"] == "#ffe08a"  # matched, declined
    (fused,) = [d for d in drawings if d["rule"] == "addmm" and d["verdict"] == "fused"]
    assert sum(n["fill"] == "#b7e4c7" for n in fused["nodes"]) == 2  # add and mm, matched
    body = browser.find_element("tag name", "body").text
    assert "addmm" in body and bmm_add in body and "not a constant" in body
