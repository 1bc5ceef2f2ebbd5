"""Compiled CPU kernels for ops that stock PyTorch runs as several passes (built on first use, each with a fallback)."""
