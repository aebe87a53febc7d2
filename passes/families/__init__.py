"""Rule families: one fusion written once, parametrised by what each backend's replacement needs.

Several ExecuTorch backends run the same fusion through their own hand-written pass
(Vulkan and XNNPACK share ``FuseBatchNormPass``; Arm has ``FuseBatchNorm2dPass`` and
``FoldScalarMulIntoConvPass``). A family module here holds the pattern, every constraint
and the folding arithmetic once; a backend's rule module only says what its replacement
needs (rule names, which forms it folds, whether an absent batch-norm weight is allowed,
where the folded constants go) and registers the rules in its own set.

* :mod:`fusionkit.passes.families.conv_batch_norm` -- convolution / linear followed by an
  inference batch norm, folded into the weight and bias (and, for Arm, a batch norm with
  nothing to fold into becomes a 1x1 depthwise convolution);
* :mod:`fusionkit.passes.families.conv_scale` -- a convolution's output multiplied by a
  constant per-channel scale, folded into the weight and bias.
* :mod:`fusionkit.passes.families.clamp_chain` -- two clamps in a row as one clamp of the
  intersected range, declined when it is empty (Arm's consecutive clamps; XNNPACK's two
  activations fused into one op).
"""

from __future__ import annotations

__all__: list[str] = []
