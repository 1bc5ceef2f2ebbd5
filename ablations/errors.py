"""Exception types of the harness. Every message is one line naming the bad value and the fix.

The base classes live in `modules.errors` (the lowest layer): every package's user-facing errors derive from
`AblationsError`, so one `isinstance` check recognises them all."""
from modules.errors import AblationsError, ConfigError

__all__ = ["AblationsError", "ConfigError", "DataError", "TokenizerError", "TrackingError", "CheckpointError",
           "DivergenceError", "exit_code", "one_line"]


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


def one_line(exc: BaseException, limit: int = 500) -> str:
    """An exception as one line: its type and the first line of its message, plus Hydra's 'Available options'
    list when the message has one (Hydra spreads it over many lines); cut to `limit` characters."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    for i, ln in enumerate(lines):
        if ln.startswith("Available options"):
            options = []
            for opt in lines[i + 1:]:
                if opt.endswith(":") or "=" in opt or " " in opt:
                    break
                options.append(opt)
            text += f" ({ln.rstrip(':').lower()}: {', '.join(options)})"
            break
    return text if len(text) <= limit else text[: limit - 3] + "..."
