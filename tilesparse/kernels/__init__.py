"""Triton kernels and their launchers. Import the family module (e.g. ``kernels.bsmm``)."""
