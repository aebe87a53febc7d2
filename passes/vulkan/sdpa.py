"""Port of ExecuTorch 1.5.1 ``patterns/sdpa.py`` (registry: ``causal_sdpa``).

The KV-cache attention of ExecuTorch's Llama export, in the in-place form
``VulkanBackend.preprocess`` sees (after ``unsafe_remove_auto_functionalized_pass``)::

    llama.update_cache(k_proj, k_cache, start_pos)     # in place, result unused
    llama.update_cache(v_proj, v_cache, start_pos)
    out = llama.custom_sdpa(q, k_cache, v_cache, start_pos, mask, dropout_p, is_causal, scale)

-> ``llama.sdpa_with_kv_cache(q, k_proj, v_proj, k_cache, v_cache, start_pos, 1,
mask, dropout_p, is_causal, scale)`` at the ``custom_sdpa``; the two
``update_cache`` nodes are erased (the fused op updates the caches itself). The fused
node calls the ATen ``OpOverload``, as stock's replacement does, not its edge form: the
Vulkan payload names an op ``node.target.__name__``, ``sdpa_with_kv_cache.default`` for
the ATen overload, which is the name the runtime registers (``SDPA.cpp``), while the
edge op's ``llama.sdpa_with_kv_cache.default`` is refused at load (``Missing operator``,
found on the real runtime). The
updates are further outputs of the match (``also``) whose replacement is
``None``: they must be unused. In the functional form (``auto_functionalized``
cache updates, e.g. in ``transform_passes()``) nothing matches, as with the
stock detector.

Constraints stated (the stock detector checks nothing and asserts in the
replacement when an update is missing; it also takes ``start_pos`` from the
first ``update_cache`` of the whole graph): both updates write the caches the
sdpa reads, at the sdpa's own ``start_pos``, before it in graph order, and
their results are unused; the caches are graph inputs (mutable buffers the
fused op writes) used only by their update, the sdpa and the program output
(no other reader that the move of the update would change); q, the projections
and the caches are fp32/fp16 rank 4 with matching batch/heads/head_dim and the
projections' seq_len equal to q's. And, unlike the stock detector, the caches start
at zero: the runtime's ``sdpa_with_kv_cache`` makes its caches from device memory, not
from the buffers (``SDPA.cpp`` ``sdpa_with_kv_cache_impl``: ``add_tensor_like``, the
buffer's sizes, never its bytes), so a buffer's non-zero initial values would be lost
(found on the real runtime: caches filled with 0.5 / 1.0, the fused program 0.77 off
eager, equal to eager with zero caches); unfused, ``update_cache`` and ``custom_sdpa``
read the buffers prepacked (``et_vk.prepack``). Zero caches are what a fresh process's
memory holds; after a freed program the memory holds its data
(``runtime.uninitialized_state``: the child runners isolate such a program).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    DtypeIn,
    GraphLeaf,
    MatchResult,
    ProgramInputs,
    PythonReplacement,
    Rank,
    Rewriter,
    Rule,
    also,
    any_value,
    capture,
    impurity,
    outputs,
)
from fusionkit.match.pattern import Op, Pattern
from fusionkit.passes.registry import (
    OperandHint,
    Pick,
    ProgramForm,
    register_rules,
)
from fusionkit.targets import resolve_op

from . import sdpa_reference
from ._common import FP_T, constraint, shape

SDPA = "llama.custom_sdpa.default"
UPDATE = "llama.update_cache.default"
SDPA_WITH_KV_CACHE = "llama.sdpa_with_kv_cache.default"


def _same(a: Any, b: Any, inputs: ProgramInputs) -> bool:
    """``a`` and ``b`` hold one value: one node, equal literals, or two nodes that compute
    the same pure op of the same operands over an input the program never writes
    (ExecuTorch's llama attention reads ``input_pos[0].item()`` once per op: distinct
    ``_local_scalar_dense`` nodes of one position)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, inputs) for x, y in zip(a, b, strict=True))
    if not isinstance(a, Node) or not isinstance(b, Node):
        return not isinstance(a, Node) and not isinstance(b, Node) and bool(a == b)
    if a is b:
        return not inputs.is_written(a)
    return (a.op == b.op == "call_function" and a.target is b.target
            and impurity(a.target) is None and _same(a.args, b.args, inputs)
            and a.kwargs.keys() == b.kwargs.keys()
            and all(_same(a.kwargs[k], b.kwargs[k], inputs) for k in a.kwargs))


def _sdpa_updates(ctx: CheckContext, k_update: Node, v_update: Node, k_cache: Node,
                  v_cache: Node, k_pos: Any, v_pos: Any, start_pos: Any) -> str | MatchResult | None:
    order = {n: i for i, n in enumerate(ctx.root.graph.nodes)}
    for p, upd, cache, pos in (("k", k_update, k_cache, k_pos), ("v", v_update, v_cache, v_pos)):
        if upd.users:
            return ctx.fail(f"the result of `{upd.name}` is used; the fused op does not "
                            "produce it", at=upd)
        if order[upd] > order[ctx.root]:
            return ctx.fail(f"`{upd.name}` runs after the sdpa: the sdpa reads the cache before "
                            "the update", at=upd)
        if pos is not start_pos and not _same(pos, start_pos, ctx.inputs):
            return ctx.fail(f"`{upd.name}` writes at {pos}, the sdpa reads at {start_pos}",
                            at=upd)
        others = [u.name for u in cache.users if u not in (upd, ctx.root) and u.op != "output"]
        if others:
            return ctx.fail(f"{p}_cache `{cache.name}` is also used by {others}; moving its "
                            "update into the sdpa would change what they read", at=cache)
    if k_cache is v_cache:
        return ctx.fail("k_cache and v_cache are the same tensor", at=v_cache)
    return None


def _initial_value(ctx: CheckContext, n: Node) -> torch.Tensor | None:
    """The real initial value of a buffer placeholder (mutable or not), else None."""
    from torch._subclasses.fake_tensor import FakeTensor

    spec = next((s for s in ctx.ep.graph_signature.input_specs
                 if getattr(s.arg, "name", None) == n.name), None)
    if spec is None or spec.target is None:
        return None
    t = ctx.ep.state_dict.get(spec.target, ctx.ep.constants.get(spec.target))
    return t if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) else None


def _sdpa_initial_caches(ctx: CheckContext, k_cache: Node, v_cache: Node) -> str | MatchResult | None:
    for p, cache in (("k", k_cache), ("v", v_cache)):
        t = _initial_value(ctx, cache)
        if t is not None and bool(t.any()):
            return ctx.fail(
                f"{p}_cache `{cache.name}` starts non-zero ({int(t.count_nonzero())} of "
                f"{t.numel()} values): the runtime's sdpa_with_kv_cache makes its caches from "
                "device memory, not from the buffer (SDPA.cpp sdpa_with_kv_cache_impl: "
                "add_tensor_like), so the fused program would lose them; unfused, update_cache "
                "and custom_sdpa read the buffer prepacked", at=cache)
    return None


def _sdpa_shapes(ctx: CheckContext, q: Node, k_proj: Node, v_proj: Node, k_cache: Node,
                 v_cache: Node) -> str | None:
    qs, kp, vp = shape(q), shape(k_proj), shape(v_proj)
    kc, vc = shape(k_cache), shape(v_cache)
    if None in (qs, kp, vp, kc, vc) or kc != vc or kp != vp:
        return f"k/v caches {kc}/{vc} or projections {kp}/{vp} differ"
    assert qs is not None and kp is not None and kc is not None
    if kp[0] != kc[0] or kp[2:] != kc[2:] or qs[0] != kc[0] or qs[3] != kc[3]:
        return f"projections {kp} and q {qs} do not fit the cache {kc} ([B, max_seq, H_kv, D])"
    if kp[1] != qs[1]:
        return f"the projections' seq_len {kp[1]} is not q's {qs[1]}"
    return None


def _sdpa_build(rw: Rewriter, q: Node, k_proj: Node, v_proj: Node, k_cache: Node,
                v_cache: Node, start_pos: Any, attn_mask: Any, dropout_p: Any, is_causal: Any,
                scale: Any) -> tuple[Node, None, None]:
    fused = rw.call(SDPA_WITH_KV_CACHE, q, k_proj, v_proj, k_cache, v_cache,
                    start_pos, 1, attn_mask, dropout_p, is_causal, scale)
    # stock's target: the ATen overload, serialized as the name the runtime has (module doc)
    fused.target = resolve_op(SDPA_WITH_KV_CACHE)
    return fused, None, None


def kv_cache_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit verify``: a decode/prefill step the kernels take: q ``[B, S, H, D]``,
    projections ``[B, S, H_kv, D]`` (``H`` a multiple of ``H_kv``), zero caches ``[B, max_S,
    H_kv, D]`` (constants: the mutable buffers a model registers), one ``start_pos`` with
    ``start_pos + S <= max_S`` read by all three ops, no mask, no dropout, causal."""
    b, s, h_kv, group, d = pick((1, 2)), pick((1, 3, 2)), pick((1, 2)), pick((1, 2)), pick((4, 8))
    max_s = s + pick((0, 2, 5))
    start = pick(sorted({0, max_s - s, (max_s - s) // 2}))
    dtype = pick((torch.float32, torch.float16))
    q = OperandHint(constant=False, dtype=dtype, shapes=((b, s, h_kv * group, d),))
    proj = OperandHint(constant=False, dtype=dtype, shapes=((b, s, h_kv, d),))
    cache = OperandHint(constant=True, fill="zeros", dtype=dtype, shapes=((b, max_s, h_kv, d),))
    pos = OperandHint(values=(start,))
    return {"q": q, "k_proj": proj, "v_proj": proj, "k_cache": cache, "v_cache": cache,
            "start_pos": pos, "k_pos": pos, "v_pos": pos, "attn_mask": OperandHint(values=(None,)),
            "dropout_p": OperandHint(values=(0.0,)), "is_causal": OperandHint(values=(True,)),
            "scale": OperandHint(values=(pick((None, 0.5)),))}


def in_place_updates(ep: Any) -> Any:
    """The program as ``VulkanBackend.preprocess`` gives it to the rule: functionalized as
    ``to_edge`` does (``auto_functionalized`` cache updates, the caches buffer mutations of
    the program), then made in place again by ``unsafe_remove_auto_functionalized_pass``."""
    from torch.export._remove_auto_functionalized_pass import unsafe_remove_auto_functionalized_pass

    return unsafe_remove_auto_functionalized_pass(ep.run_decompositions({}))


#: the Vulkan pipeline's form where the rule runs: the cache updates in place
IN_PLACE_UPDATES = ProgramForm(in_place_updates)


def llama_op(key: str, *args: Pattern, strict_defaults: bool = True, **kwargs: Pattern) -> Op:
    """``op(key, *args, **kwargs)`` for a ``llama`` op named by its canonical key, without
    resolving it: resolving imports the op library
    (``executorch.extension.llm.custom_ops``; ~60 ms, torch reads the source of every op it
    registers there), which a program holding these ops has imported already, so building
    the rule costs nothing for the programs that cannot match it.
    ``tests/test_vulkan_first_call.py`` checks that each key resolves and that the pattern equals
    ``op()``'s."""
    return Op(frozenset({key}), args, dict(kwargs), False, strict_defaults)


@register_rules("vulkan_patterns", "vulkan", takes_over="causal_sdpa",
                roots=("llama.custom_sdpa.default",), semantics=sdpa_reference.SEMANTICS)
def causal_sdpa_rule(name: str = "causal_sdpa") -> Rule:
    sdpa = llama_op(SDPA, capture("q"), capture("k_cache"), capture("v_cache"),
                    capture("start_pos"), strict_defaults=False,
                    attn_mask=any_value("attn_mask"), drpout_p=any_value("dropout_p"),
                    is_causal=any_value("is_causal"), scale=any_value("scale"))
    pattern = outputs(
        sdpa,
        also("k_update", llama_op(UPDATE, capture("k_proj"), capture("k_cache"), capture("k_pos")),
             near="k_cache", max_depth=1),
        also("v_update", llama_op(UPDATE, capture("v_proj"), capture("v_cache"), capture("v_pos")),
             near="v_cache", max_depth=1),
    )

    updates = constraint("cache_updates_fused")(_sdpa_updates)
    shapes = constraint("sdpa_shapes", hints=kv_cache_operands)(_sdpa_shapes)
    initial = constraint("caches_start_zero")(_sdpa_initial_caches)
    build = _sdpa_build

    tensors = ("q", "k_proj", "v_proj", "k_cache", "v_cache")
    return Rule(
        name=name,
        pattern=pattern,
        constraints=[*(DtypeIn(n, FP_T) for n in tensors), *(Rank(n, frozenset({4})) for n in tensors),
                     GraphLeaf("k_cache"), GraphLeaf("v_cache"), updates, shapes, initial],
        replacement=PythonReplacement(build),
        program_form=IN_PLACE_UPDATES,  # (the cache updates the check reads are in place there)
        description="llama.update_cache x2 + llama.custom_sdpa into llama.sdpa_with_kv_cache",
    )


__all__ = ["causal_sdpa_rule"]
