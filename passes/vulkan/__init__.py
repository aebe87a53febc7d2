"""Rules that port ExecuTorch's Vulkan pattern registry (installed as ``fusionkit.passes.vulkan``)."""
