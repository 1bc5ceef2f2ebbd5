"""Squared-ReLU MLP (So et al. 2021, "Primer"): same shape as the GELU MLP, activation relu(x)^2."""
import torch

from modules.mlps.base import MLPOptions
from modules.mlps.gelu import GeluMLP
from modules.registry import register


@register("mlp", "relu2")
class ReLU2MLP(GeluMLP):
    Options = MLPOptions  # no GELU approximation to choose

    def activation(self, h):
        return torch.relu(h).square()
