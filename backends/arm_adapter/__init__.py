"""Arm adapter: ExecuTorch's Arm (TOSA) lowering with its fusions as fusionkit rules.

:mod:`.reference_model` is the oracle: a lowered program run on the TOSA reference model
(``tosa-tools``) beside eager PyTorch.
"""

from __future__ import annotations
