"""What ``fusionkit.verify`` needs of ``fold_qdq``'s site: the quantize the drawn dequantize
undoes, with the dequantize's own arguments hinted to its parameters (operand hints).

Not the rule's code: the verifier's description of the pairs it folds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from fusionkit.passes.registry import OperandHint, Pick


def quantized_pair(q_ops: Sequence[str], kind_of: Callable[[str | None], str], pick: Pick
                   ) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: the quantize the drawn dequantize undoes -- the same kind
    (per tensor, with literal or tensor parameters; per channel; per token; torchao's
    affine) -- of float values on its grid (inside its range, so quantizing loses nothing),
    and the dequantize's own arguments (wildcards, hinted by argument name) with the
    quantize's parameters. The verdict is the fold on the grid; off it the pair rounds to
    the step and saturates outside the range, and the fold does not: the precision the
    Vulkan graph gives up by running in float."""
    dtype, (lo, hi) = pick(((torch.int8, (-128, 127)), (torch.uint8, (0, 255))))
    scale, zero_point = pick((0.5, 0.25, 0.03125)), pick((0, 3))
    shape = pick(((2, 3), (4,), (1, 2, 2)))
    made: dict[str, Any] = {}

    def quantize(make: Any) -> Any:
        codes = make.randint(max(lo, zero_point - 20), min(hi, zero_point + 20), shape)
        x = make.input("x", shape, torch.float32, (codes - zero_point).float() * scale)
        kind = kind_of(make.op)
        rows = (*shape[:-1], 1)  # one parameter per row (a token, a channel on the last dim)
        if kind == "_per_tensor.default":
            return make.call(q_ops[0], x, scale, zero_point, lo, hi, dtype)
        if kind == "_per_tensor.tensor":
            made["scale"] = make.input("scale", (), torch.float32, torch.tensor(scale), True)
            made["zero_point"] = make.input("zero_point", (), torch.int64,
                                            torch.tensor(zero_point), True)
            return make.call(q_ops[1], x, made["scale"], made["zero_point"], lo, hi, dtype)
        if kind == "_per_channel.default":
            n = shape[-1]
            made["scales"] = make.input("scales", (n,), torch.float32, torch.full((n,), scale), True)
            made["zero_points"] = make.input("zero_points", (n,), torch.int64,
                                             torch.full((n,), zero_point), True)
            return make.call(q_ops[2], x, made["scales"], made["zero_points"], len(shape) - 1,
                             lo, hi, dtype)
        if kind == "_per_token.default":
            made["scales"] = make.input("scales", rows, torch.float32, torch.full(rows, scale), True)
            made["zero_points"] = make.input("zero_points", rows, torch.int64,
                                             torch.full(rows, zero_point), True)
            return make.call(q_ops[3], x, made["scales"], made["zero_points"], lo, hi, dtype)
        if kind == "_affine.default":
            made["scale"] = make.input("scale", rows, torch.float32, torch.full(rows, scale), True)
            made["zero_point"] = make.input("zero_point", rows, torch.int64,
                                            torch.full(rows, zero_point), True)
            return make.call(q_ops[4], x, made["block_size"], made["scale"], made["zero_point"],
                             dtype, lo, hi)
        return make.call(q_ops[0], x, scale, zero_point, lo, hi, dtype)  # (no quantize undone)

    made["block_size"] = [1] * (len(shape) - 1) + [shape[-1]]

    def parameter(name: str, literal: Any = None) -> OperandHint:
        return OperandHint(values=() if literal is None else (literal,),
                           producer=lambda make: made[name])

    return {"q": OperandHint(producer=quantize, shapes=(shape,)),
            "*scale": parameter("scale", scale), "*zero_point": parameter("zero_point", zero_point),
            "*scales": parameter("scales"), "*zero_points": parameter("zero_points"),
            "*axis": OperandHint(values=(len(shape) - 1,)),
            "*block_size": OperandHint(values=(made["block_size"],)),
            "*quant_min": OperandHint(values=(lo,)), "*quant_max": OperandHint(values=(hi,)),
            "*dtype": OperandHint(values=(dtype,)), "*input_dtype": OperandHint(values=(dtype,)),
            "*output_dtype": OperandHint(values=(torch.float32,))}



__all__ = ["quantized_pair"]
