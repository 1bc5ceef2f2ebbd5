"""Exception types of the harness. Every message is one line naming the bad value and the fix.

The base classes live in `modules.errors` (the lowest layer): every package's user-facing errors derive from
`AblationsError`, so one `isinstance` check recognises them all."""
from modules.errors import AblationsError, ConfigError

__all__ = ["AblationsError", "ConfigError", "DataError", "TokenizerError", "TrackingError", "CheckpointError",
           "DivergenceError"]


class DataError(AblationsError):
    """The corpus cannot be read, is too short, fails its checksum, or cannot be downloaded."""


class TokenizerError(AblationsError):
    """A tokenizer cannot be built (e.g. GPT-2 BPE files missing offline) or does not match a checkpoint."""


class TrackingError(AblationsError):
    """The MLflow tracking store cannot be reached or used."""


class CheckpointError(AblationsError):
    """A checkpoint is corrupt, unreadable, or does not match the configured model/tokenizer."""


class DivergenceError(AblationsError, FloatingPointError):
    """The training loss became NaN or infinite."""


def exit_code(e: AblationsError) -> int:
    """The CLI's exit status for a user-facing error: 3 for a diverged loss, 2 for bad input."""
    return 3 if isinstance(e, DivergenceError) else 2
