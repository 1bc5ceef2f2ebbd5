"""Multi-query attention (Shazeer 2019): all query heads share one key/value head (GQA with n_kv_head = 1)."""
from dataclasses import dataclass

from modules.attention.base import AttentionOptions
from modules.attention.gqa import GroupedQueryAttention
from modules.options import fail
from modules.registry import register


@dataclass(frozen=True)
class MQAOptions(AttentionOptions):
    n_kv_head: int | None = 1  # accepted only as 1 (or null): MQA is exactly one key/value head

    def __post_init__(self):
        if self.n_kv_head not in (None, 1) or isinstance(self.n_kv_head, bool):
            fail(self.key("n_kv_head"), self.n_kv_head, "mqa always has exactly 1 key/value head")


@register("attention", "mqa")
class MultiQueryAttention(GroupedQueryAttention):
    Options = MQAOptions

    @classmethod
    def n_kv_head(cls, cfg):
        return 1
