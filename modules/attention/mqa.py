"""Multi-query attention (Shazeer 2019): all query heads share one key/value head (GQA with n_kv_head = 1)."""
from modules.attention.gqa import GroupedQueryAttention


class MultiQueryAttention(GroupedQueryAttention):
    pass  # GPTConfig.n_kv_head is 1 for attention=mqa
