"""Multi-head attention (GPT-2): every query head has its own key/value head (GQA with n_kv_head = n_head)."""
from modules.attention.base import AttentionOptions
from modules.attention.gqa import GroupedQueryAttention
from modules.registry import register


@register("attention", "mha")
class MultiHeadAttention(GroupedQueryAttention):
    Options = AttentionOptions  # nothing to choose: n_kv_head is n_head
