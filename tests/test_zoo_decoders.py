"""The model zoo, first half (decoder LLMs, and MobileNetV2 to even the halves): each
lowered through both adapters, the Vulkan payload simulated, the XNNPACK ``.pte`` run,
both compared with eager; stock ExecuTorch beside it where it fails. Cases and harness: ``zoo_models``; assertions:
``zoo_checks``; the other half: ``test_zoo_more.py``."""

from __future__ import annotations

import pytest
from zoo_checks import *  # noqa: F403  (the shared zoo tests, collected here)
from zoo_checks import case_fixture
from zoo_models import FIRST_HALF

pytestmark = pytest.mark.slow

case = case_fixture(FIRST_HALF)
