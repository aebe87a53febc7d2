"""pytest plugins that run ExecuTorch's own Arm tests under fusionkit's Arm adapter."""
