"""Vulkan adapter."""
