"""Exception types of the harness. Every message is one line naming the bad value and the fix."""


class AblationsError(Exception):
    """Base class: a user-facing error (the CLI prints it as one line and exits non-zero)."""


class ConfigError(AblationsError, ValueError):
    """A bad configuration value (names the key, the value and the fix)."""


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
