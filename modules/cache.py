"""The KV cache: per layer, only the tensors the attention variant needs, appended to along the sequence dim
(dim -2 of every tensor), so `.nbytes` is exactly what `accounting.kv_cache_bytes` predicts.

- GQA/MHA/MQA/sliding: k, v of shape (B, n_kv_head, S, hs)
- MLA: latent (B, S, d_c) and the rotated shared key k_rope (B, 1, S, d_r)
- a window keeps only the last W positions (older keys can never be seen again): a sliding-window attention's W,
  or the cap `GPT.generate` decodes with past block_size (`new_cache(batch_size, window=max_context)`)

Without a window, each tensor lives in a preallocated buffer that grows geometrically (capped at block_size while
that suffices) and the layer holds a view of its filled part: appending a decode step writes one position instead
of concatenating, which would copy the whole cache at every step (a third of gpt2-124m's decode time at 1024
tokens). `.nbytes` counts the positions held (what `accounting.kv_cache_bytes` predicts); `.reserved_nbytes`
what is allocated (at most 2x, or block_size positions).

Besides the tensors, the cache tracks per-sample bookkeeping shared by all layers (not counted in nbytes:
it is O(S) integers, not O(S * d) activations): the position id and validity (left padding) of every cached
key, and the next position id of each sample.
"""
import torch


class KVCache:
    def __init__(self, n_layer: int, batch_size: int, dtype: torch.dtype, device=None, window: int | None = None,
                 max_len: int | None = None):
        self.dtype, self.window, self.max_len = dtype, window, max_len
        self.layers: list[dict[str, torch.Tensor]] = [{} for _ in range(n_layer)]  # views of the positions held
        self._buffers: list[dict[str, torch.Tensor]] = [{} for _ in range(n_layer)]  # their storage (no window)
        self.key_pos = torch.zeros(batch_size, 0, dtype=torch.long, device=device)     # (B, S)
        self.key_valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)   # (B, S)
        self.next_pos = torch.zeros(batch_size, dtype=torch.long, device=device)       # (B,)

    @property
    def seq_len(self) -> int:
        """Number of key positions currently held (at most W for sliding windows)."""
        return self.key_valid.size(1)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer.values())

    @property
    def reserved_nbytes(self) -> int:
        """Bytes allocated: the growing buffers with their spare room (a sliding window holds no spare room)."""
        if self.window is not None:
            return self.nbytes
        return sum(b.numel() * b.element_size() for bufs in self._buffers for b in bufs.values())

    def _trim(self, t: torch.Tensor) -> torch.Tensor:
        if self.window is not None and t.size(-2) > self.window:
            t = t[..., -self.window:, :]
        return t

    def update(self, layer_idx: int, **new: torch.Tensor) -> list[torch.Tensor]:
        """Append this step's tensors (seq dim -2) and return past + new for attention, in the compute dtype.
        The current chunk attends to all of past + new; only the stored copy is trimmed to the window."""
        layer, out = self.layers[layer_idx], []
        for name, t in new.items():
            if self.window is None:
                full = layer[name] = self._append(layer_idx, name, t)
            else:  # at most W positions are kept, so concatenating costs O(W) per step
                full = t.to(self.dtype)
                if name in layer:
                    full = torch.cat((layer[name], full), dim=-2)
                layer[name] = self._trim(full).contiguous()
            out.append(full.to(t.dtype))
        return out

    def _append(self, layer_idx: int, name: str, t: torch.Tensor) -> torch.Tensor:
        """Write t after the positions held in this tensor's buffer (growing it if full); return a view of all."""
        held, bufs = self.layers[layer_idx].get(name), self._buffers[layer_idx]
        n = 0 if held is None else held.size(-2)
        need = n + t.size(-2)
        buf = bufs.get(name)
        if buf is None or need > buf.size(-2):
            # double, so each position is copied O(1) times; no further than block_size while that is enough
            cap = 2 * need if self.max_len is None or need > self.max_len else min(2 * need, self.max_len)
            grown = t.new_empty(*t.shape[:-2], cap, t.size(-1), dtype=self.dtype)
            if n:
                grown[..., :n, :] = held
            buf = bufs[name] = grown
        buf[..., n:need, :] = t
        return buf[..., :need, :]

    def advance(self, pos: torch.Tensor, valid: torch.Tensor):
        """After all layers ran on a chunk with position ids pos (B, T) and validity valid (B, T)."""
        keep = -self.window if self.window is not None else 0  # [:, -W:] keeps the last W, [:, 0:] keeps all
        self.key_pos = torch.cat((self.key_pos, pos), dim=1)[:, keep:]          # (B, S)
        self.key_valid = torch.cat((self.key_valid, valid), dim=1)[:, keep:]    # (B, S)
        last = pos.masked_fill(~valid, -1).max(dim=1).values  # (B,) last real position of the chunk
        self.next_pos = torch.where(valid.any(dim=1), last + 1, self.next_pos)
