"""Rules traced from model code (``fusionkit.rule_from_functions``).

The proof: the RMSNorm and both RoPE rules, written from the model code they
fuse, accept exactly the roots the hand-written rules accept (and decline the
same ones) on the test models; the printed DSL and the YAML form rebuild rules
that match the same; literals stay exact unless a wildcard is asked for; a
traced replacement computes what eager PyTorch computes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import rmsnorm_models as R
import torch
from torch import nn

from fusionkit import (
    CallOp,
    ExampleError,
    Rank,
    SameDtype,
    broadcasts_over_last_dim,
    find_matches,
    ref,
    replace_with,
    rule_from_functions,
    to_python,
    why_not,
)
from fusionkit.apply.rewrite import apply_matches
from fusionkit.passes.rms_norm import rms_norm_rule

# ------------------------------------------------------------------ RMSNorm


class LlamaStyleNorm(nn.Module):
    """The search code: Hugging Face's ``LlamaRMSNorm.forward`` as written there."""

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class SquareByMul(LlamaStyleNorm):
    """The other spelling of the square (``x * x``) that model code uses."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = (hidden_states * hidden_states).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


RMS_CONSTRAINTS = [SameDtype("out", "hidden_states"), SameDtype("weight", "hidden_states"),
                   broadcasts_over_last_dim("weight", "hidden_states")]


def _rms_rule(dialect: str = "edge", eps: Any = "eps") -> Any:
    """The traced rule; ``eps=None``: no wildcard, the traced 1e-6 stays an exact literal."""
    wild = {"variance_epsilon": "eps"} if eps is not None else {}
    return rule_from_functions(
        [LlamaStyleNorm(), SquareByMul()],
        replace_with("et_vk.rms_norm.default", ref("hidden_states"), ref("weight"),
                     ref("eps") if eps is not None else 1e-6),
        (torch.randn(2, 8),), name="rms_traced", wildcards=wild, parameters="foldable",
        narrowing=True,  # fp16 models: the fused op computes in x's dtype (as the port states)
        output_names=("out",), constraints=RMS_CONSTRAINTS, dialect=dialect)  # type: ignore[arg-type]


class Zoo(nn.Module):
    """Every RMSNorm test model of ``rmsnorm_models`` side by side (one export)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.rows = nn.ModuleList([r.make(dtype) for r in R.ROWS])
        self.families = nn.ModuleList([
            R.LlamaRMSNorm(), R.HFLlamaRMSNorm(), R.GemmaRMSNorm(), R.T5LayerNorm(),
            R.DiffusersRMSNorm(), R.TwoUsers(), R.SharedWeight(gemma=True),
            R.VariantNorm(), R.VariantNorm(square="pow", eps="tensor"),
            R.VariantNorm(weight_left=False, rsqrt_left=False, eps_left=False)])
        self.qwen = R.QwenAttention()
        for i, r in enumerate(R.ROWS):
            if r.name != "cast":
                self.rows[i].to(dtype)
        self.families.to(dtype)
        self.qwen.to(dtype)

    def forward(self, x: torch.Tensor, w: torch.Tensor, cond: torch.Tensor,
                h: torch.Tensor) -> tuple[Any, ...]:
        outs: list[Any] = []
        for r, m in zip(R.ROWS, self.rows, strict=True):
            extra = {"input": (w,), "adaln": (cond,)}.get(r.name, ())
            outs.append(m(x, *extra))
        outs += [m(x) for m in self.families]
        return (*outs, self.qwen(h))


def _zoo(dtype: torch.dtype) -> Any:
    def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        return Zoo(dtype).eval(), (torch.randn(2, R.D, dtype=dtype), torch.randn(R.D, dtype=dtype),
                                   torch.randn(1, 4, dtype=dtype), torch.randn(1, 3, 16, dtype=dtype))
    return R.edge_program(("authoring-zoo", dtype), make)[0]


@pytest.fixture(scope="module")
def rms() -> Any:
    return _rms_rule()


@pytest.fixture(scope="module", params=[torch.float32, torch.float16])
def zoo(request: Any) -> Any:
    return _zoo(request.param)


def _verdicts(ep: Any, rule: Any) -> tuple[list[str], list[tuple[str, str]]]:
    ms = find_matches(ep, [rule])
    return (sorted(m.root.name for m in ms.accepted),
            sorted((d.root.name, d.step) for d in ms.declined))


def test_rmsnorm_from_model_code_matches_what_the_hand_written_rule_matches(rms: Any,
                                                                           zoo: Any) -> None:
    hand_acc, hand_dec = _verdicts(zoo, rms_norm_rule())
    # reported with the shipped rule's threshold (a user's own rule reports shallower misses)
    acc, dec = _verdicts(zoo, dataclasses.replace(rms, shipped=True))
    assert acc == hand_acc
    assert dec == hand_dec
    # the zoo holds fusable and non-fusable norms: the comparison is not vacuous
    assert len(acc) >= 14 and len(dec) >= 3


def test_traced_pattern_is_the_dsl_not_one_pattern_per_permutation(rms: Any) -> None:
    src = to_python(rms)
    # two spellings of the square -> two alternatives; operand order and casts are the DSL's
    assert src.count("'aten.rsqrt.default'") == 2
    assert "through(CASTS," in src
    assert "any_float('eps')" in src  # the opt-in wildcard: the attribute, bound as `eps`
    assert "[-1]" in src and ", 2)" in src and "one_of" not in src  # literals stay exact


def test_printed_python_rebuilds_an_equal_rule(rms: Any, zoo: Any) -> None:
    ns: dict[str, Any] = {}
    exec(to_python(rms), ns)
    again = ns["rule"]
    assert repr(again.pattern) == repr(rms.pattern)
    assert _verdicts(zoo, again) == _verdicts(zoo, rms)


def test_yaml_form_rebuilds_a_rule_that_matches_the_same(rms: Any, zoo: Any) -> None:
    from fusionkit.specs import load_spec_text, rules_to_yaml

    text = rules_to_yaml([rms])
    (again,) = load_spec_text(text)
    assert _verdicts(zoo, again) == _verdicts(zoo, rms)


def test_literals_stay_exact_unless_a_wildcard_is_asked_for() -> None:
    # eps=1e-6 traced without a wildcard: a model with eps=1e-5 does not match,
    # and why_not says where and what (pytorch#195320 silently rewrote such cases)
    exact = _rms_rule("aten", eps=None)
    ep = _zoo(torch.float32)
    ms = find_matches(ep, [exact])
    hand = find_matches(ep, [rms_norm_rule()])
    eps_of = {m.root.name: m.captures["eps"] for m in hand.accepted}
    assert sorted(m.root.name for m in ms.accepted) == sorted(
        r for r, e in eps_of.items() if abs(e - 1e-6) < 1e-12)
    other = next(r for r, e in eps_of.items() if abs(e - 1e-5) < 1e-12)
    w = why_not(ep, exact, other)
    assert w.status == "declined" and w.step == "structure"
    assert "expected one of" in w.reason and "1e-06" in w.reason, w.reason


def test_aten_dialect_trace_matches_aten_programs_like_the_hand_written_rule() -> None:
    aten_rule = _rms_rule("aten")
    model = Zoo(torch.float32).eval()
    args = (torch.randn(2, R.D), torch.randn(R.D), torch.randn(1, 4), torch.randn(1, 3, 16))
    ep = torch.export.export(model, args)
    acc, _ = _verdicts(ep, aten_rule)
    assert acc == _verdicts(ep, rms_norm_rule())[0]
    assert len(acc) >= 14


# ------------------------------------------------------------------- RoPE


def _llama_rope(xq: torch.Tensor, xk: torch.Tensor, freqs_cos: torch.Tensor,
                freqs_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama's ``apply_rotary_emb`` (examples/models/llama/rope.py), as written there."""
    xq_r, xq_i = xq.float().reshape(xq.shape[:-1] + (-1, 2)).unbind(-1)  # noqa: RUF005
    xk_r, xk_i = xk.float().reshape(xk.shape[:-1] + (-1, 2)).unbind(-1)  # noqa: RUF005
    shape = [d if i == 1 or i == xq_r.ndim - 1 else 1 for i, d in enumerate(xq_r.shape)]
    freqs_cos, freqs_sin = freqs_cos.view(shape), freqs_sin.view(shape)
    xq_out_r = xq_r * freqs_cos - xq_i * freqs_sin
    xq_out_i = xq_r * freqs_sin + xq_i * freqs_cos
    xk_out_r = xk_r * freqs_cos - xk_i * freqs_sin
    xk_out_i = xk_r * freqs_sin + xk_i * freqs_cos
    xq_out = torch.stack([xq_out_r, xq_out_i], dim=-1).flatten(3)
    xk_out = torch.stack([xk_out_r, xk_out_i], dim=-1).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def _et_vk_rope(xq: torch.Tensor, xk: torch.Tensor, freqs_cos: torch.Tensor,
                freqs_sin: torch.Tensor) -> Any:
    return torch.ops.et_vk.apply_rotary_emb(xq, xk, freqs_cos, freqs_sin)


def _rope_args(seq: int = 5, hq: int = 4, hk: int = 2, hd: int = 32) -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, seq, hq, hd), torch.randn(1, seq, hk, hd), torch.randn(seq, hd // 2),
            torch.randn(seq, hd // 2))


class _Fn(nn.Module):
    def __init__(self, fn: Any, **kw: Any) -> None:
        super().__init__()
        self.fn, self.kw = fn, kw

    def forward(self, *a: torch.Tensor) -> Any:
        return self.fn(*a, **self.kw)


def test_llama_rope_from_model_code_matches_the_port_and_computes_the_same(vulkan_ops: Any) -> None:
    from executorch.backends.vulkan.patterns.rope import RotaryEmbeddingPattern
    from vulkan_pattern_helpers import edge

    from fusionkit.passes.vulkan.rope import rope_rule

    traced = rule_from_functions(
        _llama_rope, _et_vk_rope, _rope_args(), name="rope_traced",
        output_names=("xq_out", "xk_out"), wildcards={"view_copy.size"},
        constraints=[Rank("xq", frozenset({4})), Rank("xk", frozenset({4}))])
    src = to_python(traced)
    assert "near='freqs_cos'" in src  # the k output is found from an input q's chain shares
    ns: dict[str, Any] = {}
    exec(src, ns)  # the traced replacement prints as a Python replacement replaying its calls
    assert repr(ns["rule"].pattern) == repr(traced.pattern)
    assert ns["rule"].replacement.captures() == traced.replacement.captures()
    for args in (_rope_args(), _rope_args(seq=3, hq=2, hk=2, hd=8)):
        ep = edge(RotaryEmbeddingPattern(), args)
        assert _verdicts(ep, traced)[0] == _verdicts(ep, rope_rule())[0] != []
    ms = find_matches(ep, [traced])
    apply_matches(ep, ms.accepted)
    got, want = ep.module()(*args), RotaryEmbeddingPattern()(*args)
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-5)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _hf_rope(xq: torch.Tensor, xk: torch.Tensor, freqs_cos: torch.Tensor,
             freqs_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's ``apply_rotary_pos_emb`` with partial rotary support."""
    cos, sin = freqs_cos.unsqueeze(1), freqs_sin.unsqueeze(1)
    rd = cos.shape[-1]

    def emb(x: torch.Tensor) -> torch.Tensor:
        rot, rest = x[..., :rd], x[..., rd:]
        return torch.cat([rot * cos + _rotate_half(rot) * sin, rest], dim=-1)

    return emb(xq), emb(xk)


def test_hf_rope_full_and_partial_from_model_code_match_the_port(vulkan_ops: Any) -> None:
    from test_vulkan_patterns_more import HfRope
    from vulkan_pattern_helpers import edge

    from fusionkit.passes.vulkan.rope_hf import hf_rope_rule

    q, k = torch.randn(1, 5, 4, 32), torch.randn(1, 5, 2, 32)
    full, partial = (q, k, torch.randn(5, 32), torch.randn(5, 32)), \
        (q, k, torch.randn(5, 24), torch.randn(5, 24))

    def hf_vk(xq: torch.Tensor, xk: torch.Tensor, freqs_cos: torch.Tensor,
              freqs_sin: torch.Tensor) -> Any:
        return torch.ops.et_vk.apply_rotary_emb_hf(xq, xk, freqs_cos, freqs_sin, 0)

    # one model function traced at two shapes: the full and the partial rotation
    traced = rule_from_functions([_hf_rope, _hf_rope], hf_vk, [full, partial], name="hf_traced",
                                 output_names=("xq_out", "xk_out"))
    # the graph-input freqs cannot be shown to have equal halves, which the shipped rule
    # requires (tests/test_vulkan_rope_hf_tables.py): the geometry is what is compared here
    shipped = hf_rope_rule()
    hand = dataclasses.replace(shipped, constraints=[
        c for c in shipped.constraints if getattr(c, "name", "") != "hf_rope_tables_duplicated"])
    assert len(hand.constraints) == len(shipped.constraints) - 1
    seen = []
    for m, args in ((HfRope(), full), (HfRope(), partial), (HfRope(split=8), full)):
        ep = edge(m, args)
        acc = _verdicts(ep, traced)[0]
        assert acc == _verdicts(ep, hand)[0]
        seen.append(bool(acc))
    assert seen == [True, True, False]


# ------------------------------------------------------------ replacements, errors


def test_op_name_and_traced_function_replacements_compute_what_eager_computes() -> None:
    from models import SiluLike, export_edge, fresh

    def silu_like(x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)

    # aten.silu is not core ATen and the runtime has no aten::silu.out: declined at find time
    by_name = rule_from_functions(silu_like, "aten.silu.default", (torch.randn(4, 8),),
                                  name="silu_traced", dialect="aten")
    # traced, F.silu becomes what to_edge makes of it (sigmoid, mul): runnable
    by_fn = rule_from_functions(silu_like, lambda x: torch.nn.functional.silu(x),
                                (torch.randn(4, 8),), name="silu_fn", dialect="aten")
    one_op = rule_from_functions(silu_like, lambda x: torch.sigmoid(x), (torch.randn(4, 8),),
                                 name="sigmoid_fn", dialect="aten")
    assert isinstance(one_op.replacement, CallOp)  # one call of captures: data, not code
    assert one_op.replacement == rule_from_functions(
        silu_like, "aten.sigmoid.default", (torch.randn(4, 8),), name="sigmoid_name",
        dialect="aten").replacement
    base = export_edge(SiluLike(swapped=True), (torch.randn(3, 8),))
    x = torch.randn(3, 8)
    ep = fresh(base)
    ms = find_matches(ep, [by_name])
    assert not ms.accepted
    (d,) = ms.declined
    assert d.step == "executable" and "aten.silu.default" in d.reason, str(d)
    ms = find_matches(ep, [by_fn])
    assert len(ms.accepted) == 1
    apply_matches(ep, ms.accepted)
    assert torch.allclose(ep.module()(x), SiluLike(swapped=True)(x), atol=1e-6)


def test_mistakes_are_reported_as_example_errors() -> None:
    def f(x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.relu(x) * scale

    with pytest.raises(ExampleError, match="wildcard 'nope'"):
        rule_from_functions(f, "aten.relu.default", (torch.randn(2), 2.0), name="r",
                            wildcards={"nope"}, dialect="aten")
    with pytest.raises(ExampleError, match="name no capture"):
        rule_from_functions(f, lambda y: torch.relu(y), (torch.randn(2), 2.0), name="r",
                            dialect="aten")
    scaled = rule_from_functions(f, lambda x, scale: torch.relu(x) * scale,
                                 (torch.randn(2), 2.0), name="r", wildcards={"scale"},
                                 dialect="aten")
    assert "scale" in scaled.pattern.captures()


def test_trace_options_are_the_tracing_keywords_as_one_value() -> None:
    """``options=TraceOptions(...)`` builds the very rule the keywords build; one options
    value serves several rules; options and a keyword at once is refused, not merged."""
    from fusionkit.authoring.from_example import TraceOptions

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
            return torch.relu(x.to(torch.float32) * scale) * self.weight

    ex = (torch.randn(2, 4), 0.5)
    keywords: dict[str, Any] = dict(wildcards={"scale"}, dialect="aten", casts=(),
                                    parameters="foldable", output_names=("out",))
    by_keywords = rule_from_functions(Scaled(), replace_with("aten.relu.default", ref("x")),
                                      ex, name="scaled", **keywords)
    opts = TraceOptions(**keywords)
    by_options = rule_from_functions(Scaled(), replace_with("aten.relu.default", ref("x")),
                                     ex, name="scaled", options=opts)
    assert by_options.pattern == by_keywords.pattern
    assert {"scale", "weight", "out"} <= by_options.pattern.captures()
    assert by_options.constraints == by_keywords.constraints  # weight: foldable constant
    assert "aten.to.dtype(capture('x')" in repr(by_options.pattern)  # casts=(): as traced
    assert by_options.pattern != rule_from_functions(  # a field that differs shows
        Scaled(), replace_with("aten.relu.default", ref("x")), ex, name="scaled",
        options=dataclasses.replace(opts, wildcards=())).pattern
    with pytest.raises(ExampleError, match=r"options= or as keywords.*narrowing"):
        rule_from_functions(Scaled(), "aten.relu.default", ex, name="r", options=opts,
                            narrowing=True)


def test_multi_output_alternatives_merge_output_by_output() -> None:
    """Two spellings of a two-output computation become one rule that finds (and rewrites)
    either spelling; a one-output spelling among them is refused, in either order."""
    from models import export_edge, fresh, op_counts, outputs_close

    def by_relu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(x), torch.sigmoid(x)

    def by_clamp(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.clamp(x, min=0.0), torch.sigmoid(x)

    def relu_only(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)

    ex = (torch.randn(2, 8),)
    rule = rule_from_functions([by_relu, by_clamp], lambda x: (torch.relu(x), torch.tanh(x)),
                               ex, name="two_out", output_names=("first", "second"))
    assert {"first", "second", "x"} <= rule.pattern.captures()

    class Uses(nn.Module):
        def __init__(self, spelling: Any) -> None:
            super().__init__()
            self.spelling = spelling

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b = self.spelling(x)
            return a * 2 + b

    x = torch.randn(3, 8)
    for spelling in (by_relu, by_clamp):
        ep = fresh(export_edge(Uses(spelling), (x,)))
        ms = find_matches(ep, [rule])
        assert len(ms.accepted) == 1, (spelling.__name__, [str(d) for d in ms.declined])
        apply_matches(ep, ms.accepted)
        counts = op_counts(ep)
        assert not any("sigmoid" in k or "clamp" in k for k in counts), counts
        assert outputs_close(ep.module()(x), torch.relu(x) * 2 + torch.tanh(x))
    for mixed in ([by_relu, relu_only], [relu_only, by_relu]):
        with pytest.raises(ExampleError, match="different numbers of outputs"):
            rule_from_functions(mixed, "aten.relu.default", ex, name="mixed")


def test_merging_alternatives_needs_outputs_found_alike() -> None:
    """Alternatives merge root by root and output by output (the wider search depth
    kept); further outputs found from different inputs cannot share one ``also``."""
    from fusionkit import also, capture, op, outputs
    from fusionkit.authoring.multi_output import merge_alternatives

    x, y = capture("x"), capture("y")
    relu, clamp = op("aten.relu.default", x), op("aten.clamp.default", x, 0.0)
    sig = op("aten.sigmoid.default", x)
    a = outputs(relu, also("second", sig, near="x", max_depth=12))
    b = outputs(clamp, also("second", sig, near="x", max_depth=20))
    assert merge_alternatives([a, b]) == outputs(
        relu | clamp, also("second", sig | sig, near="x", max_depth=20))
    assert merge_alternatives([relu, clamp | sig]) == relu | clamp | sig
    assert merge_alternatives([relu]) is relu
    from_y = outputs(op("aten.add.Tensor", x, y), also("second", sig, near="y"))
    with pytest.raises(ExampleError, match="from different inputs"):
        merge_alternatives([a, from_y])
