"""Model Explorer inputs for a lowering: the graphs before and after the rules, and overlays
marking what fused and what declined.

Model Explorer (``ai-edge-model-explorer``) draws a graph collection and colours its nodes
by *node data*: a JSON file of per-node values, one per graph, that its side panel lists
by name (``model_explorer.node_data_builder``). :func:`write` puts four files in a
directory:

* ``NAME.etrecord`` -- the lowering's ETRecord;
* ``graphs.json`` -- the graphs Model Explorer's own ETRecord adapter
  (``etrecord-adapter-model-explorer``, the ExecuTorch extension's) builds from it:
  ``forward`` (the edge program before fusionkit's rules) and
  ``edge_after_transform/forward`` (after them). It is converted here, in the process
  that lowered the model, where a backend's fused ops (``et_vk.rms_norm``) are
  registered; a viewer that parses the ETRecord without them draws them as
  ``executorch::exir`` under another node id. The viewer needs neither the adapter
  nor ExecuTorch to open it;
* ``fusions.json`` -- the node data ``fusionkit``: ``fused: RULE`` (green) on each node a
  rule created and on every node it replaced, ``declined: RULE`` (amber) on the root of
  each declined match, ``error: RULE`` (red) where a rule's own code raised;
* ``fusion_details.json`` -- the node data ``fusionkit: details``: the nodes a fused op
  replaced; a decline's step, the node at fault and the reason.

``model-explorer DIR/graphs.json --node_data_paths=DIR/fusions.json,DIR/fusion_details.json``
shows them (:attr:`ModelExplorerFiles.command`; :meth:`ModelExplorerFiles.config` for
``model_explorer.visualize_from_config``). Model Explorer is optional: nothing here imports
it before :func:`write` runs, and :func:`missing` says what is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusionkit.integration.devtools import FUSED_GRAPH_KEY
from fusionkit.report import FusionReport
from fusionkit.result import MatchResult

__all__ = ["COLOURS", "INSTALL", "Mark", "ModelExplorerFiles", "ModelExplorerMissing",
           "marks", "missing", "write"]

#: the modules :func:`write` needs -> the distribution that installs each
REQUIRED = {"model_explorer": "ai-edge-model-explorer",
            "etrecord_adapter_model_explorer": "etrecord-adapter-model-explorer"}
#: how to install them (pyproject's ``model-explorer`` extra)
INSTALL = "pip install ai-edge-model-explorer etrecord-adapter-model-explorer"
#: verdict -> the node's colour (those of ``fusionkit explain --html``)
COLOURS = {"fused": "#b7e4c7", "declined": "#ffe08a", "error": "#ff6b6b"}
#: which verdict colours a node that has several (a rule's bug first, then a fusion)
_PRIORITY = ("error", "fused", "declined")
#: the ETRecord adapter's name for the edge program before the transform passes
#: (ExecuTorch's ``EDGE_DIALECT_GRAPH_KEY``)
BEFORE_GRAPH_KEY = "edge_dialect_graph_module"
VERDICTS_FILE, DETAILS_FILE, GRAPHS_FILE = "fusions.json", "fusion_details.json", "graphs.json"
VERDICTS_NAME, DETAILS_NAME = "fusionkit", "fusionkit: details"


class ModelExplorerMissing(ImportError):
    """Model Explorer (or its ETRecord adapter) is not installed."""


def missing() -> str | None:
    """The distribution :func:`write` needs that is not installed, or None (nothing imported)."""
    for module, distribution in REQUIRED.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules, a broken parent
            found = False
        if not found:
            return distribution
    return None


@dataclass(frozen=True)
class Mark:
    """What one rule did at one node: ``verdict`` (fused, declined, error), the rule, a detail."""

    verdict: str
    rule: str
    detail: str


#: graph (``BEFORE_GRAPH_KEY`` / ``FUSED_GRAPH_KEY``) -> node name -> its marks
Marks = dict[str, dict[str, list[Mark]]]


def _names(nodes: Iterable[Any]) -> str:
    return ", ".join(n if isinstance(n, str) else n.name for n in nodes)


def _decline(d: MatchResult) -> Mark:
    at = f" at {d.node.name}" if d.node is not None and d.node is not d.root else ""
    return Mark("error" if d.is_error else "declined", d.rule, f"{d.step}{at}: {d.reason}")


def _fused_nodes(program: Any) -> dict[str, Mark]:
    """Each node a rule created in ``program``: its rule and the nodes it replaced (its
    ``from_node`` entries of that rule, graph order, the root last)."""
    out: dict[str, Mark] = {}
    for n in program.graph.nodes:
        rule = n.meta.get("fusionkit_rule")
        if not rule:
            continue
        replaced = [s.name for s in n.meta.get("from_node") or ()
                    if getattr(s, "pass_name", None) == f"fusionkit:{rule}"]
        detail = (f"replaced {len(replaced)} node{'s' if len(replaced) != 1 else ''}: "
                  f"{_names(replaced)}" if replaced else "made by the rule")
        out[n.name] = Mark("fused", str(rule), detail)
    return out


def _same_node(nodes: Mapping[str, Any], node: Any) -> bool:
    """Whether ``nodes`` (by name) holds ``node``, or its copy: same name, same op."""
    there = nodes.get(node.name)
    return there is not None and str(there.target) == str(node.target)


def marks(report: FusionReport, *, before: Any = None, after: Any = None) -> Marks:
    """The marks of each graph, by node name: on ``after`` (the edge program after the
    rules), each node a rule created and each declined match's root still there; on
    ``before``, every node an accepted match replaced and each declined match's root.
    A graph not given is left out. The report's nodes are those of the graph the rules
    ran on: a node of ``before``/``after`` counts as one of them by name and op."""
    out: Marks = {}
    if before is not None:
        nodes = {n.name: n for n in before.graph.nodes}
        order = {name: i for i, name in enumerate(nodes)}
        per: dict[str, list[Mark]] = {}
        for m in report.accepted:
            claimed = sorted(m.claimed, key=lambda n: order.get(n.name, -1))
            detail = (f"match at {m.root.name}, {len(claimed)} nodes fused into one: "
                      f"{_names(claimed)}")
            for n in m.claimed:
                if _same_node(nodes, n):
                    per.setdefault(n.name, []).append(Mark("fused", m.rule.name, detail))
        for d in report.declined:
            if _same_node(nodes, d.root):
                per.setdefault(d.root.name, []).append(_decline(d))
        out[BEFORE_GRAPH_KEY] = per
    if after is not None:
        nodes = {n.name: n for n in after.graph.nodes}
        per = {name: [mark] for name, mark in _fused_nodes(after).items()}
        for d in report.declined:  # a node another rule made may be one too
            if _same_node(nodes, d.root):
                per.setdefault(d.root.name, []).append(_decline(d))
        out[FUSED_GRAPH_KEY] = per
    return out


def _verdict(ms: list[Mark]) -> tuple[str, str]:
    """A node's value in ``fusionkit`` and its colour: each rule's verdict once."""
    seen = list(dict.fromkeys(f"{m.verdict}: {m.rule}" for m in ms))
    colour = next(COLOURS[v] for v in _PRIORITY if any(m.verdict == v for m in ms))
    return "; ".join(seen), colour


def _details(ms: list[Mark]) -> str:
    return " | ".join(dict.fromkeys(f"{m.rule} {m.verdict}: {m.detail}" for m in ms))


@dataclass(frozen=True)
class ModelExplorerFiles:
    """What :func:`write` wrote, and how to open it."""

    directory: Path
    etrecord: Path
    graphs: Path
    overlays: tuple[Path, ...]
    #: the ids in ``graphs.json`` of the edge program before and after the rules
    before_graph: str | None = None
    after_graph: str | None = None
    #: graph id -> node id -> the node's value in ``fusionkit``
    verdicts: dict[str, dict[str, str]] = field(default_factory=dict)
    #: marks whose node the graph Model Explorer draws does not have (node, verdict: rule)
    unplaced: tuple[str, ...] = ()

    @property
    def command(self) -> str:
        """The ``model-explorer`` command that shows the graphs with both overlays."""
        paths = ",".join(str(p) for p in self.overlays)
        return (f"model-explorer {shlex.quote(str(self.graphs))} "
                f"--node_data_paths={shlex.quote(paths)}")

    def config(self) -> Any:
        """A ``model_explorer`` config with the graphs and both overlays
        (``model_explorer.visualize_from_config(files.config())``)."""
        import model_explorer

        cfg = model_explorer.config()
        cfg.add_model_from_path(str(self.graphs))
        for p in self.overlays:
            cfg.add_node_data_from_path(str(p))
        return cfg


def _edge_program(record: Any) -> Any:
    program = record.edge_dialect_program
    if isinstance(program, Mapping):  # one per method
        program = program.get("forward")
    return program


def _graph_collection(etrecord_path: Path) -> dict[str, Any]:
    """Model Explorer's ETRecord adapter's graph collection of the file, as JSON data."""
    from etrecord_adapter_model_explorer.main import ETRecordAdapter
    from model_explorer.utils import convert_adapter_response, remove_none

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExecuTorch's "Unsupported kwarg encountered"
        converted = ETRecordAdapter().convert(str(etrecord_path), {})
    (collection,) = convert_adapter_response(converted)["graphCollections"]
    return dict(remove_none(collection))


def _node_id(ids: set[str], name: str) -> str | None:
    """The adapter's id of the FX node ``name``: ExecuTorch's operator graph writes
    ``name + "_"`` (``FXOperatorGraph``), a getitem under its producer's."""
    for candidate in (f"{name}_", name):
        if candidate in ids:
            return candidate
    return None


def write(directory: str | Path, etrecord: Any, report: FusionReport, *,
          name: str = "model") -> ModelExplorerFiles:
    """Write Model Explorer's inputs for a lowering into ``directory`` (made if missing):
    ``NAME.etrecord``, ``graphs.json`` and the two overlays (the module's docstring).

    ``etrecord``: the lowering's ETRecord object, before any save/parse (the nodes'
    fusionkit metadata is in memory only), with the edge program before the rules and
    ``graph_map[FUSED_GRAPH_KEY]`` after them (``fusionkit.app.lowering.lower(...,
    etrecord=True)``); ``report``: the fusion passes' report (what fused, what declined).
    Raises :class:`ModelExplorerMissing` when Model Explorer is not installed.
    """
    lacking = missing()
    if lacking is not None:
        raise ModelExplorerMissing(f"Model Explorer is not installed (no {lacking}): {INSTALL}")
    from model_explorer import node_data_builder as ndb

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / f"{name}.etrecord"
    etrecord.save(str(record_path))
    collection = _graph_collection(record_path)
    graphs_path = out / GRAPHS_FILE
    graphs_path.write_text(json.dumps(collection))

    found = marks(report, before=_edge_program(etrecord),
                  after=(etrecord.graph_map or {}).get(FUSED_GRAPH_KEY))
    verdicts: dict[str, Any] = {}
    details: dict[str, Any] = {}
    shown: dict[str, dict[str, str]] = {}
    unplaced: list[str] = []
    graph_ids: dict[str, str] = {}
    for graph in collection["graphs"]:
        key = (graph.get("groupNodeAttributes") or {}).get("", {}).get("ETRecord Graph")
        per = found.get(key or "")
        if per is None:
            continue
        graph_ids[key] = graph["id"]
        ids = {n["id"] for n in graph["nodes"]}
        v_results: dict[str, Any] = {}
        d_results: dict[str, Any] = {}
        for node, ms in per.items():
            node_id = _node_id(ids, node)
            if node_id is None:
                unplaced.extend(f"{node} ({m.verdict}: {m.rule})" for m in ms)
                continue
            value, colour = _verdict(ms)
            v_results[node_id] = ndb.NodeDataResult(value=value, bgColor=colour)
            d_results[node_id] = ndb.NodeDataResult(value=_details(ms), bgColor=colour)
            shown.setdefault(graph["id"], {})[node_id] = value
        verdicts[graph["id"]] = ndb.GraphNodeData(
            name=VERDICTS_NAME, results=v_results, hideInAggregatedStatsTable=True,
            showLabelCountColumnsInChildrenStatsTable=True)
        details[graph["id"]] = ndb.GraphNodeData(
            name=DETAILS_NAME, results=d_results, hideInAggregatedStatsTable=True,
            hideInChildrenStatsTable=True)
    overlays = (out / VERDICTS_FILE, out / DETAILS_FILE)
    ndb.ModelNodeData(graphsData=verdicts).save_to_file(str(overlays[0]))
    ndb.ModelNodeData(graphsData=details).save_to_file(str(overlays[1]))
    return ModelExplorerFiles(out, record_path, graphs_path, overlays,
                              graph_ids.get(BEFORE_GRAPH_KEY), graph_ids.get(FUSED_GRAPH_KEY),
                              shown, tuple(unplaced))
