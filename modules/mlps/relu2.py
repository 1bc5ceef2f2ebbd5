"""Squared-ReLU MLP (So et al. 2021, "Primer"): same shape as the GELU MLP, activation relu(x)^2."""
import torch

from modules.mlps.gelu import GeluMLP


class ReLU2MLP(GeluMLP):
    def activation(self, h):
        return torch.relu(h).square()
