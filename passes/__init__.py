"""Ready-made fusion rules and YAML specs (installed as ``fusionkit.passes``)."""
