"""Case tables of the benchmark suites (JSON data, read with importlib.resources)."""
