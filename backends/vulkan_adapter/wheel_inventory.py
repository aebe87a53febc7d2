"""What the Vulkan runtime has when none is installed: inferred from the ExecuTorch wheel.

Without a runtime (no ``scripts/vulkan-runtime``, nothing probed) the partitioner,
``check()`` and ``simulate()`` judge a program against :func:`wheel_inventory`, so that
what is known without a probe gives the same verdict with or without one; the probe
(:mod:`.runtime_probe`) only adds what the wheel cannot tell.

What is inferred, and from what:

* **shaders** -- the wheel ships the runtime's shader templates
  (``executorch/backends/vulkan/runtime/graph/ops/glsl/*.yaml``) and their generator
  (``gen_vulkan_spv.py``). :func:`wheel_shader_names` expands the templates with the
  generator's own parser: the variant names the runtime is built with. A binary op's
  shader name is composed as ``BinaryOp.cpp`` does (:mod:`.inspect.shaders`) and looked
  up there: ``binary_eq_texture3d_int32`` is not among them (the template names the
  int32 variant ``binary_eq_int32_texture3d``), as it is not in the probed registry.
* **operators** -- the 1.5.1 partitioner's registry (``op_registry.py``) is taken as
  the runtime's operator list, except the ops of :data:`OP_SHADER_STEMS`: the registry's
  quantize / dequantize / choose-qparams ops, whose runtime implementation composes its
  shader names from the stems given there (read from the runtime's sources; the
  ``QuantizeDequantize.cpp`` / ``ChooseQParams.cpp`` the registry names). An op none of
  whose stems starts a shader name of the wheel has no implementation in the runtime
  built from it: ``quantized_decomposed.dequantize_per_channel.default`` (the weight-only
  linears a preprocess rule declines leave it), ``torchao.dequantize_affine.default``.
  Every probed answer for these ops agrees (``tests/test_vulkan_static_verdicts.py``).

* **registered names** -- the wheel ships no C++; the names the runtime's
  ``VK_REGISTER_OP`` calls register for this ExecuTorch version are kept with fusionkit
  (:mod:`.registered_operators`, read from the runtime's sources). A partitioner op that
  none registers is missing: ``aten.logical_not.default``, ``aten.t_copy.default``,
  ``dim_order_ops._clone_dim_order.default``, the ATen names the preprocess's in-place form
  produces (``linear.default``). For a version with no list kept, these count as present.

Not inferable (the probe finds it): a shader whose name the runtime composes differently
from the templates (a template expanded but the C++ asking for another name).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os

from .runtime_probe import RuntimeInventory

__all__ = ["OP_SHADER_STEMS", "InferredInventory", "effective_inventory", "inferred_operators",
           "registered_verdicts", "wheel_inventory", "wheel_shader_names"]

#: op (payload name) -> the stems its runtime implementation composes shader names from
#: (``<stem>_<storage>_<dtypes>``); present iff a shader of the wheel starts with one.
#: The first eight: the registry's ``QuantizeDequantize.cpp`` / ``ChooseQParams.cpp`` ops;
#: the rest are ops the runtime has, kept as a control that the inference says so.
OP_SHADER_STEMS: dict[str, tuple[str, ...]] = {
    "quantized_decomposed.quantize_per_channel.default": ("quantize_per_channel",),
    "quantized_decomposed.dequantize_per_channel.default": ("dequantize_per_channel",),
    "quantized_decomposed.quantize_per_token.default": ("quantize_per_token",),
    "quantized_decomposed.dequantize_per_token.default": ("dequantize_per_token",),
    "quantized_decomposed.choose_qparams.tensor": ("choose_qparams_tensor",),
    "quantized_decomposed.choose_qparams_per_token_asymmetric.default": (
        "choose_qparams_per_token_asymmetric",),
    "torchao.quantize_affine.default": ("quantize_affine",),
    "torchao.dequantize_affine.default": ("dequantize_affine",),
    "torchao.choose_qparams_affine.default": ("choose_qparams_per_row",),
    "aten._weight_int8pack_mm.default": ("linear_qcs8w",),
    "et_vk.linear_qcs4w.default": ("linear_qcs4w",),
    "et_vk.linear_q4gsw.default": ("linear_q4gsw",),
    "et_vk.rms_norm.default": ("rms_norm",),
}


def _glsl_dir() -> str:
    from executorch.backends.vulkan.runtime import gen_vulkan_spv

    return os.path.join(os.path.dirname(gen_vulkan_spv.__file__), "graph", "ops", "glsl")


@functools.cache
def wheel_shader_names() -> frozenset[str]:
    """Every shader variant name the wheel's templates expand to (``gen_vulkan_spv``'s
    own ``parseTemplateYaml``; the GLSL sources, which the wheel does not ship, are not
    needed for the names). Empty if the wheel has no templates."""
    try:
        from executorch.backends.vulkan.runtime import gen_vulkan_spv as gen
    except Exception:  # another wheel layout: nothing inferred
        return frozenset()
    parser = object.__new__(gen.SPVGenerator)  # its __init__ needs the GLSL sources
    parser.shader_template_params = {}
    parser.env = {}
    for path in sorted(glob.glob(os.path.join(_glsl_dir(), "*.yaml"))):
        try:
            parser.parseTemplateYaml(path)
        except Exception:  # a template the parser refuses: its names are not inferred
            continue
    return frozenset(v["NAME"] for variants in parser.shader_template_params.values()
                     for v in variants)


def inferred_operators(shaders: frozenset[str]) -> dict[str, bool]:
    """:data:`OP_SHADER_STEMS`' ops -> whether a shader of ``shaders`` starts with a stem."""
    return {op: any(s.startswith(stem + "_") or s == stem for stem in stems for s in shaders)
            for op, stems in OP_SHADER_STEMS.items()}


@dataclasses.dataclass(frozen=True)
class InferredInventory(RuntimeInventory):
    """A :class:`~.runtime_probe.RuntimeInventory` inferred from the wheel, not probed."""

    executorch: str = ""

    def describe(self) -> str:
        return (f"the Vulkan runtime the executorch {self.executorch} wheel implies (its shader "
                "templates and op registry; no runtime probed)")

    def named(self) -> str:
        return self.describe()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("executorch")
    except PackageNotFoundError:
        return "?"


def registered_verdicts(registered: frozenset[str]) -> dict[str, bool]:
    """Every candidate operator (:func:`~.runtime_probe.candidate_operators`) -> whether
    the runtime registers that name."""
    from .runtime_probe import candidate_operators

    return {op: op in registered for op in candidate_operators()}


@functools.cache
def wheel_inventory() -> InferredInventory:
    """The runtime the installed ExecuTorch wheel implies (see the module): computed once
    per process (the templates parsed and the candidates listed: ~0.2 s)."""
    from .registered_operators import registered_operators

    shaders = wheel_shader_names()
    ver = _version()
    registered = registered_operators(ver)
    operators = registered_verdicts(registered) if registered is not None else {}
    if shaders:  # an op registered whose shaders the wheel lacks is missing as well
        for op, present in inferred_operators(shaders).items():
            operators[op] = operators.get(op, True) and present
    return InferredInventory(f"wheel-executorch-{ver}", operators, shaders, executorch=ver)


def effective_inventory(runtime: object = "auto") -> RuntimeInventory:
    """The inventory a verdict is judged by: ``runtime`` when it is one; ``"auto"``: the
    one :func:`~.runtime_choice.use_runtime` set, else the installed runtime's cached probe;
    and with neither (or ``None``), :func:`wheel_inventory`."""
    if isinstance(runtime, str):
        from .runtime_choice import runtime_inventory

        runtime = runtime_inventory(runtime)
    if runtime is None:
        return wheel_inventory()
    assert isinstance(runtime, RuntimeInventory), runtime
    return runtime
