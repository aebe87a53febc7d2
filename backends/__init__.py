"""Backend adapters (installed as ``fusionkit.backends``)."""
