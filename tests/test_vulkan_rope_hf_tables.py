"""hf_rope and the runtime's cos/sin tables (issue 24 item 5).

Found on the real runtime: ``et_vk.apply_rotary_emb_hf`` reads only the first half of
cos/sin, for both halves (its shader assumes transformers' ``cat((freqs, freqs), -1)``),
while the op's CPU reference uses all of it. So the hf_rope rule fuses only tables it can
prove duplicated (computed from ``cat([f, f], -1)``, or constants whose halves compare
equal), and the simulator computes the op as the runtime does. Each program is lowered
once (ours: the drop-in; stock 1.5.1) and run on the real runtime in one child.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("executorch")

from test_vulkan_patterns_more import HfRope, _hf, _hf_freqs
from vulkan_pattern_helpers import declined, edge, fuse, ops
from vulkan_real_programs import _lower_to_executorch, pattern_graphs_once
from vulkan_runtime_oracle import session

real_vulkan = session()

HF = "et_vk.apply_rotary_emb_hf.default"
FIRST_HALF = "the runtime's apply_rotary_emb_hf reads only the first half of the table"


class HfRopeComputed(torch.nn.Module):
    """The freqs computed in the graph from the positions, as transformers does:
    ``cat((freqs, freqs), -1)``, cos/sin, an attention scaling, a dtype cast."""

    def __init__(self, rd: int, halves: str = "same") -> None:
        super().__init__()
        self.halves = halves
        self.register_buffer("inv", 1.0 / (10000 ** (torch.arange(0, rd, 2).float() / rd)))

    def forward(self, xq, xk, pos):  # type: ignore[no-untyped-def]
        freqs = pos[:, None].float() * self.inv[None, :]
        other = freqs if self.halves == "same" else freqs * 0.5
        emb = torch.cat((freqs, other), dim=-1)
        cos, sin = (emb.cos() * 1.0).to(torch.float32), (emb.sin() * 1.0).to(torch.float32)
        return _hf(xq, xk, cos, sin)


class HfRopeConstTable(torch.nn.Module):
    """cos/sin are constants (buffers): transformers-shaped, or random (halves differ)."""

    def __init__(self, halves: str) -> None:
        super().__init__()
        cos, sin = _hf_freqs(5, 32) if halves == "same" else (torch.randn(5, 32),
                                                               torch.randn(5, 32))
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, xq, xk):  # type: ignore[no-untyped-def]
        return _hf(xq, xk, self.cos, self.sin)


def _qk() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, 5, 4, 32, generator=g), torch.randn(1, 5, 2, 32, generator=g)


def _pos() -> torch.Tensor:
    return torch.arange(3, 8)


def _random_freqs(rd: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(5, rd, generator=g), torch.randn(5, rd, generator=g)


# ----------------------------------------------------------------- the rule's verdicts


@pytest.mark.parametrize("case", ["input", "constant", "computed"])
def test_tables_not_provably_duplicated_are_declined(case: str) -> None:
    if case == "input":
        m, a, blamed = HfRope(), (*_qk(), *_random_freqs()), "freqs_cos `cos`"
        why = "is a user input: its halves cannot be shown equal"
    elif case == "constant":
        m, a, blamed = HfRopeConstTable("differ"), _qk(), "freqs_cos"
        why = "is a constant whose two halves differ"
    else:
        m, a, blamed = HfRopeComputed(32, "differ"), (*_qk(), _pos()), "freqs_cos"
        why = "is a cat that is not cat([f, f], -1)"
    ep = edge(m, a)
    ms = fuse(ep)
    assert not any(x.rule.name == "hf_rope" for x in ms.accepted)
    reasons = declined(ms, "hf_rope")
    assert any(blamed in r and why in r and FIRST_HALF in r for r in reasons), reasons
    assert HF not in ops(ep)
    for got, want in zip(ep.module()(*a), m(*a), strict=True):
        assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("rd", [32, 24])
def test_duplicated_tables_are_fused(rd: int) -> None:
    for m, a in ((HfRopeComputed(rd), (*_qk(), _pos())), (HfRopeConstTable("same"), _qk())):
        if rd != 32 and isinstance(m, HfRopeConstTable):
            continue
        ep = edge(m, a)
        ms = fuse(ep)
        assert [x.rule.name for x in ms.accepted].count("hf_rope") == 1, declined(ms, "hf_rope")
        assert HF in ops(ep) and "aten.neg.default" not in ops(ep)
        for got, want in zip(ep.module()(*a), m(*a), strict=True):
            assert torch.allclose(got, want, atol=1e-5)


# -------------------------------------------------------------- lowered, on the runtime


#: (name, path) -> (pte, simulator outputs, check() problems, delegated ops)
_LOWERED: dict[tuple[str, str], tuple[bytes, list[torch.Tensor], list[str], set[str]]] = {}


def _lowered(name: str, path: str, m: torch.nn.Module, a: tuple[Any, ...]
             ) -> tuple[bytes, list[torch.Tensor], list[str], set[str]]:
    from fusionkit.backends.vulkan_adapter import check, simulate
    from fusionkit.backends.vulkan_adapter.inspect.payload import decode_payload
    from fusionkit.backends.vulkan_adapter.inspect.prepack_check import vulkan_delegates

    if (name, path) not in _LOWERED:
        with pattern_graphs_once():
            et = _lower_to_executorch(path, torch.export.export(m, a), None)
        pte = bytes(et.buffer)
        sim = [t for t in simulate(et, *a) if isinstance(t, torch.Tensor)]
        problems = [f"{p.kind}: {p.message}" for p in check(et)]
        delegated = {c.name for d in vulkan_delegates(pte)
                     for c in decode_payload(d.payload).graph.chain}
        _LOWERED[name, path] = (pte, sim, problems, delegated)
    return _LOWERED[name, path]


def _close(got: Any, want: Any, tol: float = 1e-4) -> bool:
    return all(torch.allclose(g, w, atol=tol, rtol=tol) for g, w in zip(got, want, strict=True))


_PROGRAMS = {
    "computed rd=32": lambda: (HfRopeComputed(32), (*_qk(), _pos())),
    "computed rd=24": lambda: (HfRopeComputed(24), (*_qk(), _pos())),
    "constant same": lambda: (HfRopeConstTable("same"), _qk()),
}


@pytest.mark.parametrize("name", list(_PROGRAMS))
def test_duplicated_tables_fused_equal_eager_on_the_runtime(name: str, real_vulkan: Any
                                                            ) -> None:
    m, a = _PROGRAMS[name]()
    with torch.no_grad():
        want = m(*a)
    pte, sim, problems, delegated = _lowered(name, "fusionkit", m, a)
    assert HF in delegated and problems == []
    assert _close(sim, want)
    if real_vulkan is not None:
        res = real_vulkan.run(pte, list(a))
        assert res.ok, res.message
        assert _close(res.outputs, want)


@pytest.mark.parametrize("name", ["input", "constant"])
def test_differing_halves_ours_declines_stock_is_wrong_as_the_simulator_says(
        name: str, real_vulkan: Any) -> None:
    m, a = ((HfRope(), (*_qk(), *_random_freqs())) if name == "input"
            else (HfRopeConstTable("differ"), _qk()))
    with torch.no_grad():
        want = m(*a)
    ours = _lowered(name, "fusionkit", m, a)
    stock = _lowered(name, "stock", m, a)
    assert HF not in ours[3] and HF in stock[3]
    assert _close(ours[1], want) and not _close(stock[1], want)
    # check(): a constant table is read and judged; a graph input cannot be from the payload
    assert ours[2] == []
    tables = [x for x in stock[2] if "reads only the first half" in x]
    assert tables == ([] if name == "input" else [
        f"runtime_condition: {HF} argument {a!r}: the runtime computes garbage "
        "(rotary_embedding_hf shader): it reads only the first half of the table's last "
        "dim, for both halves, and this constant's halves differ"
        for a in ("freqs_cos", "freqs_sin")]), stock[2]
    # the simulator computes what the runtime's shader does: cos/sin's first half twice
    rd = 32
    c, s = (t[:, : rd // 2].repeat(1, 2) for t in
            ((a[2], a[3]) if name == "input" else (m.cos, m.sin)))  # type: ignore[union-attr]
    assert _close(stock[1], _hf(a[0], a[1], c, s))  # type: ignore[arg-type]
    if real_vulkan is not None:
        r_ours, r_stock = real_vulkan.run(ours[0], list(a)), real_vulkan.run(stock[0], list(a))
        assert r_ours.ok and r_stock.ok, (r_ours.message, r_stock.message)
        assert _close(r_ours.outputs, want)
        assert not _close(r_stock.outputs, want)
        assert _close(r_stock.outputs, stock[1])  # the simulator predicted the runtime
