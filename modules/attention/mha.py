"""Multi-head attention (GPT-2): every query head has its own key/value head (GQA with n_kv_head = n_head)."""
from modules.attention.gqa import GroupedQueryAttention


class MultiHeadAttention(GroupedQueryAttention):
    pass  # GPTConfig.n_kv_head is n_head for attention=mha
