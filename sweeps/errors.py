"""The sweeps' user-facing error: every command of sweeps/ prints it as one line and exits non-zero."""
from __future__ import annotations

from modules.errors import AblationsError


class SweepError(AblationsError):
    """A user-facing error: the CLI prints it as one line and exits non-zero."""
