"""The model zoo, second half: more decoders (Gemma3, Phi3, OLMo2), diffusers blocks
(AdaLN RMSNorm, SD3.5 MMDiT, Flux single-stream), convolutional vision models
(ResNet, ConvNeXt), LeViT and wav2vec2. See ``test_zoo_decoders.py``."""

from __future__ import annotations

import pytest
from zoo_checks import *  # noqa: F403  (the shared zoo tests, collected here)
from zoo_checks import case_fixture
from zoo_models import FIRST_HALF, ZOO

pytestmark = pytest.mark.slow

case = case_fixture([m.name for m in ZOO if m.name not in FIRST_HALF])
