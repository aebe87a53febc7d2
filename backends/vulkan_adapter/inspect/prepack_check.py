"""Static check of lowered Vulkan programs: what would the runtime abort on?

:func:`check` finds every Vulkan delegate of a program, decodes its payload with
the hand-written reader in :mod:`.payload` (which, unlike ExecuTorch's
flatc-JSON reader, copes with infinite scalars) and reports:

* ``not_constant`` — an op argument that the Vulkan runtime prepacks without
  pass-through (``prepack_standard``, which aborts unless
  ``graph.val_is_tref(arg)``) but that is not a constant: a tensor value with
  ``constant_id < 0``, a ``None`` where the op needs a tensor, or a non-tensor.
  Which arguments those are is :data:`PREPACKED_ARGS`, taken from the runtime's
  C++ sources (see ``shared/vulkan-prepacked-args.md``);
* ``bad_reference`` — an argument or constant id pointing outside the graph;
* ``constant_size`` — a constant whose stored bytes do not have the size its
  tensor needs (e.g. a view serialized together with its whole base storage);
* ``missing_constant`` — a constant whose named-data key is not in the program
  (only checked when the named data is at hand);
* ``runtime_condition`` — an operator whose arguments break one of its
  :mod:`.runtime_conditions` (the rotary ops' ``size_at(-3, xq) == size_at(-3, xk)``,
  the quantized ops' group sizes, ...): the conditions the simulator stops on, read
  from the payload's tensor sizes and scalars; and a delegate input or output whose
  dim order in the program is not contiguous (``executorch_call_delegate``,
  :data:`.runtime_conditions.DELEGATE_DIM_ORDER`): the runtime copies it in contiguous
  order, so a channels_last output holds the NCHW result's bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fusionkit.integration.spilled_data import blob_bytes

from .payload import (
    PayloadError,
    VkGraph,
    VkValue,
    VulkanPayload,
    decode_payload,
)
from .prepacked_args import PREPACKED_ARGS, PrepackedArg
from .runtime_conditions import (
    DELEGATE_ARGUMENT_COUNT,
    DELEGATE_DIM_ORDER,
    OUTPUT_DTYPE_ARGUMENT,
    RuntimeSymInt,
    conditions_for,
    contiguous_dim_order,
    violated,
)
from .shaders import missing_shader

__all__ = [
    "PREPACKED_ARGS",
    "PrepackedArg",
    "Problem",
    "VulkanDelegate",
    "check",
    "check_payload",
    "stored_dtype",
    "vulkan_delegates",
]

BACKEND_ID = "VulkanBackend"
ABORT = "the runtime aborts in prepack_standard ... (graph.val_is_tref(tensor_data)) is false!"


@dataclass(frozen=True)
class Problem:
    """One thing in a Vulkan delegate that the runtime would reject."""

    kind: str  # "not_constant", "bad_reference", "constant_size", "missing_constant"
    delegate: int  # index among the program's Vulkan delegates, in program order
    op: str | None  # serialized op name, e.g. "et_vk.rms_norm.default"
    arg_index: int | None
    arg_name: str | None
    value_id: int | None
    message: str
    method: str = "forward"
    chain_index: int | None = None  # position of the op in the delegate's chain

    def __str__(self) -> str:
        at = f"{self.method}: Vulkan delegate {self.delegate}"
        if self.chain_index is not None:
            at += f", op #{self.chain_index}"
        return f"{at}: {self.message}"


@dataclass(frozen=True)
class VulkanDelegate:
    """A Vulkan delegate payload found in a program, with what is known of its named data."""

    index: int
    method: str
    payload: bytes
    #: named-data key -> byte size, when the program's named data is at hand
    named_sizes: dict[str, int] | None = None
    #: the named data holds every key (False for a .pte, whose .ptd may hold more)
    named_complete: bool = True
    #: the delegate call's tensors in the program: ("input" | "output", index, shape,
    #: dim order), when the program around the payload is at hand
    boundary: tuple[tuple[str, int, tuple[int, ...], tuple[int, ...]], ...] = ()
    #: named-data key -> its bytes, when the program's named data is at hand
    named_data: dict[str, bytes] | None = None
    #: how many arguments the serialized delegate call passes (its inputs, then its
    #: outputs): known for a .pte (an edge program's call also lists mutated buffers)
    call_arguments: int | None = None


# -------------------------------------------------------------------- the checks


def describe_value(v: VkValue | None) -> str:
    if v is None:
        return "nothing"
    t = v.tensor
    if t is not None:
        return f"a runtime tensor ({t.dtype_name}{list(t.dims)}, constant_id={t.constant_id})"
    if v.kind in ("Null", "NONE"):
        return "None"
    return f"a {v.kind} ({v.value!r})"


def _check_args(g: VkGraph, d: VulkanDelegate) -> Iterator[Problem]:
    for ci, call in enumerate(g.chain):
        wanted = PREPACKED_ARGS.get(call.name)
        if not wanted:
            continue
        for arg in wanted:
            where = f"{call.name} argument {arg.index} ({arg.name})"

            def problem(kind: str, vid: int | None, message: str, arg: PrepackedArg = arg,
                        op: str = call.name, ci: int = ci) -> Problem:
                return Problem(kind, d.index, op, arg.index, arg.name, vid, message,
                               d.method, ci)

            # the last arg of an OperatorCall is its output
            if arg.index >= len(call.args) - 1:
                yield problem("bad_reference", None,
                              f"{where} is missing: the call has {len(call.args)} value ids")
                continue
            vid = call.args[arg.index]
            v = g.value(vid)
            if v is None:
                yield problem("bad_reference", vid,
                              f"{where} refers to value {vid}, but the graph has "
                              f"{len(g.values)} values")
                continue
            t = v.tensor
            if t is None:
                if v.kind in ("Null", "NONE") and arg.none_ok:
                    continue
                yield problem("not_constant", vid,
                              f"{where} is {describe_value(v)}, not a constant tensor (TensorRef): "
                              f"{ABORT}")
            elif not t.is_constant:
                yield problem("not_constant", vid,
                              f"{where} is not a constant (TensorRef): value {vid} is "
                              f"{describe_value(v)}; {ABORT}")


def _check_constants(g: VkGraph, p: VulkanPayload, d: VulkanDelegate) -> Iterator[Problem]:
    seen: set[int] = set()
    for vid, v in enumerate(g.values):
        t = v.tensor
        if t is None or not t.is_constant or t.constant_id in seen:
            continue
        seen.add(t.constant_id)
        cid = t.constant_id
        what = f"constant {cid} (value {vid}, {t.dtype_name}{list(t.dims)})"

        def problem(kind: str, message: str, vid: int = vid) -> Problem:
            return Problem(kind, d.index, None, None, None, vid, message, d.method)

        if cid >= len(g.constants):
            yield problem("bad_reference", f"value {vid} refers to constant {cid}, but the "
                          f"graph has {len(g.constants)} constants")
            continue
        c = g.constants[cid]
        need = t.nbytes
        if need is not None and c.length != need:
            yield problem("constant_size",
                          f"{what} holds {c.length} bytes but its tensor needs {need}"
                          + (": the serializer copied more than the tensor (a view's whole "
                             "base storage?)" if c.length > need else ""))
        if c.in_named_data:
            if d.named_sizes is not None:
                size = d.named_sizes.get(c.named_key)
                if size is None and d.named_complete:
                    yield problem("missing_constant",
                                  f"{what} refers to named data {c.named_key!r}, which the "
                                  "program does not hold")
                elif size is not None and size != c.length:
                    yield problem("constant_size",
                                  f"{what}: named data {c.named_key!r} has {size} bytes, the "
                                  f"graph declares {c.length}")
        elif c.offset + c.length > len(p.raw):
            yield problem("bad_reference",
                          f"{what} spans bytes [{c.offset}, {c.offset + c.length}) of a "
                          f"{len(p.raw)}-byte constant section")


def check_payload(payload: bytes | VulkanPayload, delegate: int = 0, method: str = "forward",
                  named_sizes: dict[str, int] | None = None,
                  named_complete: bool = True,
                  boundary: tuple[tuple[str, int, tuple[int, ...], tuple[int, ...]], ...] = (),
                  named_data: dict[str, bytes] | None = None,
                  call_arguments: int | None = None,
                  ) -> list[Problem]:
    """Problems of one decoded (or raw) Vulkan delegate payload (``boundary``,
    ``call_arguments``: see :class:`VulkanDelegate`)."""
    raw = b"" if isinstance(payload, VulkanPayload) else bytes(payload)
    d = VulkanDelegate(delegate, method, raw, named_sizes, named_complete, boundary,
                       call_arguments=call_arguments)
    try:
        p = payload if isinstance(payload, VulkanPayload) else decode_payload(raw)
    except PayloadError as e:
        return [Problem("bad_payload", delegate, None, None, None, None,
                        f"the payload cannot be decoded: {e}", method)]
    return [*_check_args(p.graph, d), *_check_constants(p.graph, p, d),
            *_check_conditions(p.graph, d), *_check_boundary(p.graph, d),
            *_check_argument_count(p.graph, d),
            *_check_rope_tables(p, d, named_data)]


HF_ROPE = "et_vk.apply_rotary_emb_hf.default"


def _constant_fp32(p: VulkanPayload, vid: int, named_data: dict[str, bytes] | None) -> Any:
    """The fp32 constant value ``vid`` of ``p`` (or the one an ``et_vk.prepack`` packed into
    it) as a tensor, else None."""
    import torch

    packed = {c.args[-1]: c.args[0] for c in p.graph.chain
              if c.name == "et_vk.prepack.default" and len(c.args) == 2}
    vid = packed.get(vid, vid)  # a prepacked constant: its TensorRef
    v = p.graph.value(vid)
    t = None if v is None else v.tensor
    if t is None or not t.is_constant or t.constant_id >= len(p.graph.constants):
        return None
    if t.dtype_name != "FLOAT32" or not t.dims:
        return None
    c = p.graph.constants[t.constant_id]
    data = ((named_data or {}).get(c.named_key) if c.in_named_data
            else p.raw[c.offset:c.offset + c.length])
    need = t.numel * 4
    if data is None or len(data) < need:
        return None
    return torch.frombuffer(bytearray(data[:need]), dtype=torch.float32).reshape(t.dims)


def _check_rope_tables(p: VulkanPayload, d: VulkanDelegate,
                       named_data: dict[str, bytes] | None) -> Iterator[Problem]:
    """The runtime's apply_rotary_emb_hf reads only the first half of cos/sin (for both
    halves): a constant table whose halves differ computes garbage. A table that is not a
    constant (a delegate input, or computed by the payload) cannot be judged here."""
    import torch

    for ci, call in enumerate(p.graph.chain):
        if call.name != HF_ROPE or len(call.args) < 4:
            continue
        for i, arg in ((2, "freqs_cos"), (3, "freqs_sin")):
            table = _constant_fp32(p, call.args[i], named_data)
            if table is None:
                continue
            half = table.shape[-1] // 2
            if torch.equal(table[..., :half], table[..., half:2 * half]):
                continue
            yield Problem("runtime_condition", d.index, call.name, i, arg, call.args[i],
                          f"{call.name} argument {arg!r}: the runtime computes garbage "
                          "(rotary_embedding_hf shader): it reads only the first half of the "
                          "table's last dim, for both halves, and this constant's halves "
                          "differ", d.method, ci)


@dataclass(frozen=True)
class _Sized:
    """A payload tensor as the runtime conditions read it: its sizes and dtype (None: a
    datatype the payload leaves unset)."""

    shape: tuple[int, ...]
    dtype: Any = None


def stored_dtype(t: Any) -> Any:
    """The torch dtype of a payload tensor's ``datatype`` (None: unset)."""
    import torch

    names = {0: torch.bool, 1: torch.uint8, 2: torch.int8, 3: torch.int32, 4: torch.float16,
             5: torch.float32, 6: torch.float64, 7: torch.int64}  # payload.VK_DTYPE_NAMES
    return names.get(t.datatype)


def _sized(t: Any) -> _Sized:
    return _Sized(tuple(t.dims), stored_dtype(t))


def _condition_arguments(g: VkGraph, name: str, ins: tuple[int, ...]) -> dict[str, Any] | None:
    """Schema argument name -> what the conditions read (sizes, scalars, lists); None when
    ``name`` has no torch schema of this arity."""
    import torch

    parts = ("llama." + name if name.count(".") == 1 else name).split(".")
    try:
        schema = getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])._schema
    except (AttributeError, IndexError, RuntimeError):
        return None
    if len(schema.arguments) != len(ins):
        return None
    out: dict[str, Any] = {}
    for a, vid in zip(schema.arguments, ins, strict=True):
        v = g.value(vid)
        if v is None or v.kind in ("Null", "NONE"):
            out[a.name] = None
        elif v.tensor is not None:
            out[a.name] = _sized(v.tensor)
        elif v.kind == "SymInt":  # computed as the graph runs
            out[a.name] = RuntimeSymInt(v.value or 0)
        elif v.kind == "ValueList":
            vals = [g.value(i) for i in v.value]
            out[a.name] = [_sized(e.tensor) if e is not None and e.tensor else
                           (e.value if e is not None else None) for e in vals]
        else:
            out[a.name] = list(v.value) if isinstance(v.value, tuple) else v.value
    return out


def _check_boundary(g: VkGraph, d: VulkanDelegate) -> Iterator[Problem]:
    """Each delegate input / output the runtime copies in the wrong order (its dim order),
    unless the payload converts it (fusionkit's :mod:`..boundary_dim_order`)."""
    from ..boundary_dim_order import converts_input, converts_output

    for kind, k, shape, order in d.boundary:
        if contiguous_dim_order(shape, order):
            continue
        ids = g.input_ids if kind == "input" else g.output_ids
        vid = ids[k] if k < len(ids) else None
        converts = converts_input if kind == "input" else converts_output
        if vid is not None and converts(g, vid, shape, order):
            continue
        verb = "reads" if kind == "input" else "writes"
        yield Problem("runtime_condition", d.index, DELEGATE_DIM_ORDER.op, k,
                      f"{kind} {k}", vid,
                      f"the delegate's {kind} {k} ({list(shape)}) has dim order "
                      f"{tuple(order)}: the runtime {verb} it in contiguous order "
                      f"({DELEGATE_DIM_ORDER.source}), so its values are wrong",
                      d.method)


def _check_conditions(g: VkGraph, d: VulkanDelegate) -> Iterator[Problem]:
    """Each op's runtime conditions on the payload's sizes (what the simulator stops on)."""
    for ci, call in enumerate(g.chain):
        if not conditions_for(call.name):
            continue
        args = _condition_arguments(g, call.name, tuple(call.args[:-1]))
        if args is None:
            continue
        if call.name in OUTPUT_DTYPE_ARGUMENT and args.get("dtype") is None:
            out = g.value(call.args[-1])
            if out is not None and out.tensor is not None:
                args["dtype"] = _sized(out.tensor).dtype
        for c in violated(call.name, args):
            vid = next((call.args[i] for i, n in enumerate(args) if n == c.args[0]), None)
            yield Problem("runtime_condition", d.index, call.name, None, c.args[0], vid,
                          f"{call.name} argument {c.args[0]!r}: {c.message()}", d.method, ci)


def _check_argument_count(g: VkGraph, d: VulkanDelegate) -> Iterator[Problem]:
    """The delegate call passes one argument per graph input and output (one value
    returned for two outputs leaves the graph an output short)."""
    from .runtime_conditions import delegate_argument_count

    if d.call_arguments is None:
        return
    message = delegate_argument_count(len(g.input_ids), len(g.output_ids), d.call_arguments)
    if message is not None:
        yield Problem("runtime_condition", d.index, DELEGATE_ARGUMENT_COUNT.op, None, "args",
                      None, message, d.method)


# ------------------------------------------------------------ finding delegates


def _named_sizes(nd: Any) -> dict[str, int] | None:
    """key -> size of a NamedDataStoreOutput (pte and external data)."""
    if nd is None:
        return None
    out: dict[str, int] = {}
    for key, entry in (getattr(nd, "pte_data", None) or {}).items():
        out[key] = len(nd.buffers[entry.buffer_index])
    for entries in (getattr(nd, "external_data", None) or {}).values():
        for key, entry in entries.items():
            out[key] = len(nd.buffers[entry.buffer_index])
    return out


def _named_bytes(nd: Any) -> dict[str, bytes] | None:
    """key -> bytes of a NamedDataStoreOutput's .pte data."""
    if nd is None:
        return None
    return {key: blob_bytes(nd.buffers[entry.buffer_index])
            for key, entry in (getattr(nd, "pte_data", None) or {}).items()}


def _from_edge(prog: Any) -> Iterator[VulkanDelegate]:
    """The delegates of an ``EdgeProgramManager`` (every method) or of one lowered
    ``ExportedProgram`` (reported as ``forward``)."""
    from executorch.exir.lowered_backend_module import get_lowered_submodules
    from torch.export import ExportedProgram

    index = 0
    programs = ([("forward", prog)] if isinstance(prog, ExportedProgram) else
                [(m, prog.exported_program(m)) for m in sorted(prog.methods)])
    for method, ep in programs:
        gm = ep.graph_module
        for module in gm.modules():
            if not hasattr(module, "graph"):
                continue
            for _, lm, call in get_lowered_submodules(module):
                if lm.backend_id != BACKEND_ID:
                    continue
                nd = getattr(lm, "named_data_store_output", None)
                named = _named_sizes(nd)
                # no call_arguments: the edge call's outputs also list the buffers the
                # delegate mutates, which the serialized call does not pass
                yield VulkanDelegate(index, method, bytes(lm.processed_bytes),
                                     named if named is not None else {},
                                     boundary=_edge_boundary(call), named_data=_named_bytes(nd))
                index += 1


def _edge_boundary(call: Any) -> tuple[tuple[str, int, tuple[int, ...], tuple[int, ...]], ...]:
    """The tensors of one ``executorch_call_delegate`` node, from its fake values."""
    import torch

    def of(kind: str, vals: list[Any]) -> list[tuple[str, int, tuple[int, ...], tuple[int, ...]]]:
        out = []
        for k, v in enumerate(vals):
            if not isinstance(v, torch.Tensor):
                continue
            try:
                out.append((kind, k, tuple(int(s) for s in v.shape),
                            tuple(int(d) for d in v.dim_order())))
            except Exception:  # symbolic sizes / strides: the .pte's values say
                continue
        return out

    ins = [a.meta.get("val") if hasattr(a, "meta") else None for a in call.args[1:]]
    val = call.meta.get("val")
    return (*of("input", ins), *of("output", list(val) if isinstance(val, (tuple, list))
                                   else [val]))


def _pte_boundary(plan: Any, args: list[int], n_outputs: int
                  ) -> tuple[tuple[str, int, tuple[int, ...], tuple[int, ...]], ...]:
    """The tensors of one ``DelegateCall`` (its inputs, then its outputs) in the plan."""
    from executorch.exir.schema import Tensor

    out = []
    n_inputs = len(args) - n_outputs
    for j, vi in enumerate(args):
        v = plan.values[vi].val
        if isinstance(v, Tensor):
            kind, k = ("input", j) if j < n_inputs else ("output", j - n_inputs)
            out.append((kind, k, tuple(int(s) for s in v.sizes),
                        tuple(int(d) for d in v.dim_order)))
    return tuple(out)


def _from_pte(pte: bytes) -> Iterator[VulkanDelegate]:
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DataLocation

    pf = deserialize_pte_binary(pte)
    program = pf.program
    # named data only lists what lives in the .pte itself; constants kept in a
    # separate .ptd are not visible here, so missing keys are not reported
    from executorch.exir.schema import DelegateCall

    index = 0
    for plan in program.execution_plan:
        calls: dict[int, list[int]] = {}  # delegate index -> the args of its (first) call
        for chain in plan.chains:
            for ins in chain.instructions:
                if isinstance(ins.instr_args, DelegateCall):
                    calls.setdefault(ins.instr_args.delegate_index, list(ins.instr_args.args))
        for di, delegate in enumerate(plan.delegates):
            if delegate.id != BACKEND_ID:
                continue
            ref = delegate.processed
            if ref.location != DataLocation.INLINE:
                raise PayloadError(f"Vulkan delegate {index} of {plan.name!r} has its payload "
                                   f"in location {ref.location}, which was not restored")
            data = bytes(program.backend_delegate_data[ref.index].data)
            sizes = None
            if pf.named_data is not None:
                sizes = {k: len(pf.named_data.buffers[e.buffer_index])
                         for k, e in pf.named_data.pte_data.items()}
            boundary: tuple[tuple[str, int, tuple[int, ...], tuple[int, ...]], ...] = ()
            if di in calls:
                try:
                    n_out = len(decode_payload(data).graph.output_ids)
                except PayloadError:
                    n_out = None
                if n_out is not None:
                    boundary = _pte_boundary(plan, calls[di], n_out)
            blobs = None
            if pf.named_data is not None:
                blobs = {k: blob_bytes(pf.named_data.buffers[e.buffer_index])
                         for k, e in pf.named_data.pte_data.items()}
            yield VulkanDelegate(index, plan.name, data, sizes, named_complete=False,
                                 boundary=boundary, named_data=blobs,
                                 call_arguments=len(calls[di]) if di in calls else None)
            index += 1


def vulkan_delegates(program: Any) -> list[VulkanDelegate]:
    """Every Vulkan delegate payload of ``program`` (see :func:`check` for what it may be)."""
    from executorch.exir import EdgeProgramManager, ExecutorchProgramManager
    from torch.export import ExportedProgram

    if isinstance(program, (EdgeProgramManager, ExportedProgram)):
        return list(_from_edge(program))
    if isinstance(program, ExecutorchProgramManager):
        return list(_from_pte(bytes(program.buffer)))
    if isinstance(program, (str, os.PathLike)):
        with open(program, "rb") as f:
            program = f.read()
    if isinstance(program, (bytes, bytearray, memoryview)):
        data = bytes(program)
        if data[4:8] == b"VH00":  # a bare delegate payload
            return [VulkanDelegate(0, "forward", data)]
        return list(_from_pte(data))
    raise TypeError(
        "check() takes an ExecutorchProgramManager, an EdgeProgramManager, an ExportedProgram, "
        f".pte bytes or a path to a .pte file, not {type(program).__name__}"
    )


def check(program: Any, runtime: Any = "auto") -> list[Problem]:
    """Problems the Vulkan runtime would abort on, in every Vulkan delegate of ``program``.

    ``program``: an ``ExecutorchProgramManager``, an ``EdgeProgramManager``, a
    lowered ``ExportedProgram`` (``edge.exported_program()``), the bytes of a .pte
    (or of one delegate payload) or a path to a .pte file. ``runtime``: the runtime
    whose operators and shader variants the program needs (an operator or a binary-op
    shader variant it lacks is a problem: ``missing_operator``, ``missing_shader``): a
    probed :class:`~fusionkit.backends.vulkan_adapter.runtime_probe.RuntimeInventory`;
    ``"auto"`` (the default), the installed runtime's probe, else what the wheel implies
    (:func:`~fusionkit.backends.vulkan_adapter.wheel_inventory.wheel_inventory`: its
    shader templates and op registry); ``None``: the wheel's, whatever is installed.
    Returns an empty list when there are none.
    """
    from ..wheel_inventory import effective_inventory

    inventory = effective_inventory(runtime)
    problems: list[Problem] = []
    for d in vulkan_delegates(program):
        problems.extend(check_payload(d.payload, d.index, d.method, d.named_sizes,
                                      d.named_complete, d.boundary, d.named_data,
                                      d.call_arguments))
        problems.extend(_check_available(d, inventory))
    return problems


def _check_available(d: VulkanDelegate, runtime: Any) -> Iterator[Problem]:
    """What the probed runtime lacks, op by op (the simulator stops on the same)."""
    try:
        g = decode_payload(d.payload).graph
    except PayloadError:
        return
    for ci, call in enumerate(g.chain):
        if not runtime.has_operator(call.name):
            yield Problem("missing_operator", d.index, call.name, None, None, None,
                          f"{runtime.describe()} has no operator {call.name}: it aborts with "
                          f"'Missing operator: {call.name}'", d.method, ci)
            continue
        if len(call.args) < 2:
            continue
        out, in1 = g.value(call.args[-1]), g.value(call.args[0])
        shader = missing_shader(call.name, out.tensor if out else None,
                                in1.tensor if in1 else None, runtime.shaders,
                                g.storage_type_override)
        if shader is not None:
            yield Problem("missing_shader", d.index, call.name, 0, "self", call.args[0],
                          f"{call.name}: {runtime.describe()} has no shader {shader}: it aborts "
                          f"with 'Could not find ShaderInfo with name {shader}'", d.method, ci)
