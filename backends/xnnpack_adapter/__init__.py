"""XNNPACK adapter."""
