"""The model zoo: real architectures from ``transformers`` and ``diffusers``, built from
their configurations (tiny sizes, random weights, nothing downloaded), lowered through
both fusionkit adapters and through stock ExecuTorch beside them.

One table, :data:`ZOO`, drives the tests (``tests/test_zoo_*.py``) and the README table
(``python3 tests/zoo_models.py``, markdown on stdout). Every lowering starts from a deep
copy of the exported program: ExecuTorch 1.5.1's Vulkan lowering (stock, and the adapter
with it) deletes non-persistent buffers from the caller's ``ExportedProgram.constants``
(see :func:`stock_vulkan_mutates_constants`), so a second lowering of it fails.
"""

from __future__ import annotations

import copy
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["FIRST_HALF", "KNOWN_BUGS", "RUNTIME_NUMERICS", "STOCK_FAILS", "ZOO", "Lowering", "ZooCase", "ZooModel", "build", "lower_case", "markdown_table"]

#: |error| vs eager above which a lowered model counts as wrong (float32 end to end)
TOLERANCE = 1e-4


@dataclass(frozen=True)
class ZooModel:
    name: str
    kind: str  # what it exercises, for the table
    factory: Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]


class CausalLMLogits(torch.nn.Module):
    """``model(input_ids, use_cache=False).logits``: how a user exports an HF decoder."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


SEQ = 6
VOCAB = 64


def _decoder(config_cls: str, model_cls: str, **overrides: Any) -> Callable[[], Any]:
    def factory() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        import transformers

        kw: dict[str, Any] = dict(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16,
            max_position_embeddings=32, tie_word_embeddings=False,
            pad_token_id=0, bos_token_id=1, eos_token_id=2,
        )
        kw.update(overrides)
        config = getattr(transformers, config_cls)(**kw)
        model = getattr(transformers, model_cls)(config)
        ids = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(1))
        return CausalLMLogits(model), (ids,)

    return factory


class AdaLNContinuous(torch.nn.Module):
    """diffusers ``AdaLayerNormContinuous(norm_type="rms_norm")``: scale/shift from ``chunk``."""

    def __init__(self) -> None:
        super().__init__()
        from diffusers.models.normalization import AdaLayerNormContinuous

        self.norm = AdaLayerNormContinuous(32, 16, elementwise_affine=False, eps=1e-6,
                                           norm_type="rms_norm")

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return self.norm(x, emb)


def _adaln() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(2)
    return AdaLNContinuous(), (torch.randn(1, 8, 32, generator=g), torch.randn(1, 16, generator=g))


class JointBlock(torch.nn.Module):
    """An SD3.5-style MMDiT block: AdaLN-Zero modulation, qk RMSNorm, joint attention."""

    def __init__(self) -> None:
        super().__init__()
        from diffusers.models.attention import JointTransformerBlock

        self.block = JointTransformerBlock(dim=32, num_attention_heads=2, attention_head_dim=16,
                                           context_pre_only=False, qk_norm="rms_norm")

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        enc, hidden = self.block(hidden_states=x, encoder_hidden_states=ctx, temb=temb)
        return hidden + enc.mean(dim=1, keepdim=True)


def _joint_block() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(3)
    return JointBlock(), (torch.randn(1, 8, 32, generator=g), torch.randn(1, 4, 32, generator=g),
                          torch.randn(1, 32, generator=g))


class FluxSingleBlock(torch.nn.Module):
    """A Flux single-stream block: AdaLN modulation, qk RMSNorm, fused MLP+attention."""

    def __init__(self) -> None:
        super().__init__()
        from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock

        self.block = FluxSingleTransformerBlock(dim=32, num_attention_heads=2, attention_head_dim=16)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        out = self.block(hidden_states=x, encoder_hidden_states=ctx, temb=temb)
        return out[1] if isinstance(out, tuple) else out


def _flux_single() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(4)
    return FluxSingleBlock(), (torch.randn(1, 8, 32, generator=g), torch.randn(1, 4, 32, generator=g),
                               torch.randn(1, 32, generator=g))


class ImageFeatures(torch.nn.Module):
    """``model(pixel_values).last_hidden_state`` of an HF vision backbone."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).last_hidden_state


def _bn_stats(model: torch.nn.Module, seed: int, affine: bool = True) -> torch.nn.Module:
    """Non-trivial batch-norm statistics and (``affine``) affine parameters (1-D and 2-D
    norms), so a fold or a norm that is wrong shows."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for m in model.modules():
            if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                if affine and m.affine:
                    m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model


def _resnet() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import ResNetConfig, ResNetModel

    config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                          layer_type="basic")
    model = _bn_stats(ResNetModel(config), 5, affine=False)
    return ImageFeatures(model), (torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(6)),)


def _convnext() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import ConvNextConfig, ConvNextModel

    config = ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                            patch_size=2)
    return ImageFeatures(ConvNextModel(config)), (
        torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(7)),)


def _mobilenet_v2() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import MobileNetV2Config, MobileNetV2Model

    config = MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.25, min_depth=4)
    return ImageFeatures(_bn_stats(MobileNetV2Model(config), 5)), (
        torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)


def _levit() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import LevitConfig, LevitModel

    config = LevitConfig(image_size=32, num_channels=3, patch_size=16, hidden_sizes=[16, 24, 32],
                         num_attention_heads=[1, 2, 2], depths=[1, 1, 1], key_dim=[8, 8, 8],
                         mlp_ratio=[2, 2, 2], attention_ratio=[2, 2, 2])
    return ImageFeatures(_bn_stats(LevitModel(config), 5)), (
        torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(4)),)


class AudioFeatures(torch.nn.Module):
    """``model(input_values).last_hidden_state`` of an HF speech encoder."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return self.model(input_values=input_values).last_hidden_state


def _wav2vec2() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                            conv_kernel=(10, 3), num_conv_pos_embeddings=8,
                            num_conv_pos_embedding_groups=4, feat_extract_norm="group",
                            do_stable_layer_norm=False)
    return AudioFeatures(Wav2Vec2Model(config)), (
        torch.randn(1, 400, generator=torch.Generator().manual_seed(7)),)


#: the zoo: decoder families, RMSNorm variants, diffusion blocks, convolutional vision models
ZOO: list[ZooModel] = [
    ZooModel("llama", "Llama decoder (RMSNorm, RoPE, GQA)", _decoder("LlamaConfig", "LlamaForCausalLM")),
    ZooModel("smollm3", "SmolLM3 decoder (NoPE layers)", _decoder(
        "SmolLM3Config", "SmolLM3ForCausalLM", no_rope_layer_interval=2)),
    ZooModel("mistral", "Mistral decoder (sliding window)", _decoder(
        "MistralConfig", "MistralForCausalLM", sliding_window=4)),
    ZooModel("qwen2", "Qwen2 decoder (qkv bias)", _decoder("Qwen2Config", "Qwen2ForCausalLM")),
    ZooModel("qwen3", "Qwen3 decoder (q/k RMSNorm)", _decoder("Qwen3Config", "Qwen3ForCausalLM")),
    ZooModel("gemma", "Gemma decoder (1 + w RMSNorm)", _decoder("GemmaConfig", "GemmaForCausalLM")),
    ZooModel("gemma2", "Gemma2 decoder (1 + w, soft-capping, sliding window)", _decoder(
        "Gemma2Config", "Gemma2ForCausalLM", sliding_window=4)),
    ZooModel("gemma3", "Gemma3 text decoder (1 + w, q/k norms)", _decoder(
        "Gemma3TextConfig", "Gemma3ForCausalLM", sliding_window=4)),
    ZooModel("phi3", "Phi3 decoder (fused qkv, partial RoPE)", _decoder(
        "Phi3Config", "Phi3ForCausalLM", partial_rotary_factor=0.5)),
    ZooModel("olmo2", "OLMo2 decoder (post-norm, q/k RMSNorm)", _decoder("Olmo2Config", "Olmo2ForCausalLM")),
    ZooModel("adaln_rms", "diffusers AdaLayerNormContinuous(rms_norm)", _adaln),
    ZooModel("sd3_joint_block", "SD3.5 MMDiT block (AdaLN-Zero, qk RMSNorm)", _joint_block),
    ZooModel("flux_single_block", "Flux single-stream block (AdaLN, qk RMSNorm)", _flux_single),
    ZooModel("resnet", "ResNet (conv + batch norm)", _resnet),
    ZooModel("convnext", "ConvNeXt (depthwise conv, LayerNorm)", _convnext),
    ZooModel("mobilenet_v2", "MobileNetV2 (depthwise conv + batch norm + ReLU6)", _mobilenet_v2),
    ZooModel("levit", "LeViT (Linear + BatchNorm1d, attention)", _levit),
    ZooModel("wav2vec2", "wav2vec2 (conv1d, GroupNorm, weight_norm conv, GELU)", _wav2vec2),
]

BY_NAME = {m.name: m for m in ZOO}


#: model -> why its Vulkan result differs from eager by more than the tolerance on
#: ExecuTorch's real Vulkan runtime too, the adapter's lowering being right: a numerics
#: fact of the runtime, which the simulator models. Such a model's Vulkan columns are
#: judged against eager computed as the runtime computes (:class:`RuntimeGelu`), at the
#: same tolerance; the tests also assert that the deviation from eager is real (over the
#: tolerance), so an entry that is no longer needed fails.
RUNTIME_NUMERICS: dict[str, str] = {
    # GELU(approximate="none") in the conv feature extractor, the positional conv and the
    # feed-forward; the runtime's only gelu shader is the tanh form (unary_op.yaml).
    # Measured on the real runtime (lavapipe): 2.3e-3 off eager at output scale 3.3, as simulated
    "wav2vec2": "the Vulkan runtime's gelu shader computes the tanh form whatever `approximate` says",
}


class RuntimeGelu(torch.overrides.TorchFunctionMode):
    """Eager as the Vulkan runtime computes it: every ``gelu`` in its tanh form."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.nn.functional.gelu:
            kwargs["approximate"] = "tanh"
        return func(*args, **kwargs)


@dataclass
class ZooCase:
    """A zoo model built and exported once: the eager reference and the ExportedProgram."""

    model: ZooModel
    inputs: tuple[torch.Tensor, ...]
    eager: torch.Tensor
    exported: Any
    #: eager as the Vulkan runtime computes it, for a model in :data:`RUNTIME_NUMERICS`
    eager_runtime: torch.Tensor | None = None


def build(name: str) -> ZooCase:
    entry = BY_NAME[name]
    torch.manual_seed(0)
    module, inputs = entry.factory()
    module.eval()
    eager_runtime = None
    with torch.no_grad():
        eager = module(*inputs)
        if name in RUNTIME_NUMERICS:
            with RuntimeGelu():
                eager_runtime = module(*inputs)
        exported = torch.export.export(module, inputs)
    return ZooCase(entry, inputs, eager, exported, eager_runtime)


@dataclass
class Lowering:
    """One lowering of a zoo case and what came of it."""

    path: str  # vulkan | vulkan-stock | xnnpack | xnnpack-stock
    error: str | None = None  # the exception that stopped the lowering, one line
    frames: list[str] = field(default_factory=list)  # its traceback's last frames
    delegates: int = 0
    fused: dict[str, int] = field(default_factory=dict)  # rule -> count
    declined: dict[str, int] = field(default_factory=dict)  # "rule: step" -> count
    decline_reasons: list[str] = field(default_factory=list)
    folded: int = 0  # values computed at lowering time (FoldConstantSubgraphsPass)
    problems: list[str] = field(default_factory=list)  # Vulkan check()
    run_error: str | None = None  # simulation / runtime failure
    max_error: float | None = None  # vs eager
    #: vs eager as the runtime computes it (Vulkan paths of a RUNTIME_NUMERICS model)
    runtime_error: float | None = None
    seconds: float = 0.0  # process CPU time of lowering + running

    @property
    def judged_error(self) -> float | None:
        """The error the tests judge: vs the runtime's numerics where the zoo records them."""
        return self.runtime_error if self.runtime_error is not None else self.max_error

    @property
    def ok(self) -> bool:
        err = self.judged_error
        return (self.error is None and self.run_error is None and not self.problems
                and err is not None and err <= TOLERANCE)


def _one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def _root(e: BaseException) -> BaseException:
    while e.__cause__ is not None:
        e = e.__cause__
    return e


def _stock_partitioner(backend: str) -> Any:
    if backend == "vulkan":
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

        return VulkanPartitioner()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


def _uninstall_all() -> None:
    import fusionkit.backends.vulkan_adapter as va
    import fusionkit.backends.xnnpack_adapter as xa

    va.uninstall()
    xa.uninstall()


def lower_case(case: ZooCase, path: str) -> Lowering:
    """Lower ``case`` along ``path``, serialize it and run it; never raises."""
    t0 = time.process_time()
    result = _lower_case(case, path)
    result.seconds = time.process_time() - t0
    return result


def _lower_case(case: ZooCase, path: str) -> Lowering:
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    from fusionkit import FusionPass

    backend, stock = path.split("-")[0], path.endswith("-stock")
    result = Lowering(path)
    passes: list[Any] = []
    if stock:
        _uninstall_all()
        partitioner = _stock_partitioner(backend)
    elif backend == "vulkan":
        from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes

        passes, partitioner = list(transform_passes()), VulkanPartitioner()
    else:
        from fusionkit.backends.xnnpack_adapter import XnnpackPartitioner
        from fusionkit.backends.xnnpack_adapter import transform_passes as xnn_passes

        passes, partitioner = list(xnn_passes()), XnnpackPartitioner()
    try:
        edge = to_edge_transform_and_lower(copy.deepcopy(case.exported),
                                           transform_passes=passes or None,
                                           partitioner=[partitioner])
        program = edge.to_executorch()
    except Exception as e:  # recorded: a stock failure is data, ours fails the test
        root = _root(e)
        result.error = _one_line(e) if root is e else f"{_one_line(e)} <- {_one_line(root)}"
        tb = traceback.extract_tb(root.__traceback__)
        result.frames = [f"{f.filename}:{f.lineno} in {f.name}" for f in tb[-4:]]
        return result
    finally:
        if stock:
            _uninstall_all()
    result.delegates = len(get_lowered_submodules(edge.exported_program().graph_module))
    for p in passes:
        if isinstance(p, FusionPass):
            for name, rr in p.report.rules.items():
                if rr.fused:
                    result.fused[name] = result.fused.get(name, 0) + rr.fused
            for d in p.report.declined:
                key = f"{d.rule}: {d.step}"
                result.declined[key] = result.declined.get(key, 0) + 1
                result.decline_reasons.append(f"{d.rule} at {d.root}: {d.step} — {d.reason}")
        result.folded += len(getattr(p, "folded", ()))
    try:
        out = _run(program, case.inputs, backend, result)
    except Exception as e:  # the runtime would abort, or the simulator cannot run it
        result.run_error = _one_line(e)
        return result
    result.max_error = float((out.float() - case.eager.float()).abs().max())
    if backend == "vulkan" and case.eager_runtime is not None:
        result.runtime_error = float((out.float() - case.eager_runtime.float()).abs().max())
    return result


def _run(program: Any, inputs: tuple[torch.Tensor, ...], backend: str, result: Lowering) -> torch.Tensor:
    if backend == "vulkan":
        from fusionkit.backends.vulkan_adapter import check, simulate

        result.problems = [str(p) for p in check(program)]
        out = simulate(program, *inputs)
    else:
        from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

        pte = bytes(program.buffer)  # held while it runs: the runtime does not copy it
        out = _load_for_executorch_from_buffer(pte).forward(inputs)
    if isinstance(out, (list, tuple)):
        out = out[0]
    assert isinstance(out, torch.Tensor)
    return out


PATHS = ("vulkan", "vulkan-stock", "xnnpack", "xnnpack-stock")

#: (model, backend) -> what stock ExecuTorch 1.5.1 fails with (a substring); every other
#: zoo model lowers with stock too. The tests pin these and show the adapter passing.
STOCK_FAILS: dict[tuple[str, str], str] = {
    # FuseBatchNormPass re-trace, see fusionkit.integration.constant_subgraphs
    ("gemma2", "vulkan"): "doesn't match mode",
    # the stock RMSNorm fusion takes the AdaLN scale as the prepacked weight: the runtime aborts
    ("adaln_rms", "vulkan"): "is not a constant",
    # ... and Gemma's computed `1 + w` weight
    ("gemma", "vulkan"): "is not a constant",
    ("gemma3", "vulkan"): "is not a constant",
    # LayerNorm(elementwise_affine=False) delegated with weight None: the runtime throws
    # ("native_layer_norm requires weight to be non-None"); see passes/vulkan/layer_norm_affine
    ("sd3_joint_block", "vulkan"): "argument 2 (weight) is not a constant",
    ("flux_single_block", "vulkan"): "argument 2 (weight) is not a constant",
    # LeViT's Linear + BatchNorm1d (no conv absorbs it) delegated as a 2-D batch norm: the
    # runtime refuses it at load ("BatchNorm only support 4d tensor"; 22 such norms)
    ("levit", "vulkan"): "BatchNorm.cpp: add_native_batch_norm_node: (in_sizes.size() == 4) is false",
    # wav2vec2's weight_norm positional conv: the weight is computed, the runtime prepacks it
    # and refuses it at load; check() also reports the 3-D GroupNorm (NaN on the runtime)
    ("wav2vec2", "vulkan"): "aten.convolution.default argument 1 (weight) is not a constant",
}

#: (model, path) -> a bug outside the zoo's files that makes the adapter's lowering wrong
#: (the tests xfail strictly with this reason, so a fix shows up as XPASS); none left
KNOWN_BUGS: dict[tuple[str, str], str] = {}


#: the two halves of the zoo (one test file each, so both xdist workers share it)
FIRST_HALF = ["llama", "smollm3", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "mobilenet_v2"]


def _short(text: str, n: int) -> str:
    text = re.sub(r" object at 0x[0-9a-f]+", "", text.split(" <- ")[-1])
    return text if len(text) <= n else text[: n - 1] + "…"


def _cell(low: Lowering) -> str:
    if low.error is not None:
        return f"lowering fails: `{_short(low.error, 150)}`"
    if low.run_error is not None:
        where = "simulation" if low.path.startswith("vulkan") else "run"
        return f"{where} fails: `{_short(low.run_error, 150)}`"
    text = f"{low.max_error:.1e}"
    if low.runtime_error is not None:
        text += f" (tanh-GELU eager: {low.runtime_error:.1e})"
    if low.problems:
        text += f"; check(): {len(low.problems)} problem(s)"
    return text


def markdown_table(results: dict[str, dict[str, Lowering]]) -> str:
    lines = [
        "| model | what | Vulkan: fused | Vulkan: declined | Vulkan max abs err | stock Vulkan |"
        " XNNPACK max abs err | stock XNNPACK |",
        "|---|---|---|---|---:|---|---:|---|",
    ]
    for name, by_path in results.items():
        vk = by_path["vulkan"]
        fused = ", ".join(f"{k} ×{v}" for k, v in sorted(vk.fused.items())) or "—"
        declined = ", ".join(f"{k} ×{v}" for k, v in sorted(vk.declined.items())) or "—"
        if vk.folded:
            fused += f" (+{vk.folded} constant value(s) folded)"
        lines.append(
            f"| {name} | {BY_NAME[name].kind} | {fused} | {declined} | {_cell(vk)} | "
            f"{_cell(by_path['vulkan-stock'])} | {_cell(by_path['xnnpack'])} | "
            f"{_cell(by_path['xnnpack-stock'])} |")
    return "\n".join(lines)


def stock_vulkan_mutates_constants(case: ZooCase) -> list[str]:
    """Constants the stock Vulkan lowering removes from the program it is given."""
    from executorch.exir import to_edge_transform_and_lower

    ep = copy.deepcopy(case.exported)
    before = set(ep.constants)
    _uninstall_all()
    try:
        to_edge_transform_and_lower(ep, partitioner=[_stock_partitioner("vulkan")])
    except Exception:
        pass
    return sorted(before - set(ep.constants))


def main(argv: list[str]) -> int:
    names = argv or [m.name for m in ZOO]
    results: dict[str, dict[str, Lowering]] = {}
    for name in names:
        case = build(name)
        results[name] = {p: lower_case(case, p) for p in PATHS}
        print(f"{name}: " + ", ".join(f"{p}={'ok' if r.ok else _cell(r)} {r.seconds:.0f}s" for p, r in results[name].items()),
              file=sys.stderr, flush=True)
    print(markdown_table(results))
    print()
    for name, by_path in results.items():
        for p, low in by_path.items():
            if low.error and low.frames:
                print(f"- {name} / {p}: {low.error}\n  " + "\n  ".join(low.frames))
            for reason in low.decline_reasons if p == "vulkan" else []:
                print(f"- {name} / vulkan declined: {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
