"""pytest plugins that run ExecuTorch's own XNNPACK op tests with fusionkit installed."""
