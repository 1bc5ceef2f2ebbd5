"""The one error hierarchy of the project. Every user-facing error of every package derives from AblationsError,
so a command line recognises it with `isinstance` and prints it as one line; anything else is a bug and keeps its
traceback. It lives here, in the lowest layer, because `modules` may import nothing from the harness."""


class AblationsError(Exception):
    """A user-facing error: one line naming the bad value and the fix; the CLI exits non-zero."""


class ConfigError(AblationsError, ValueError):
    """A bad configuration value (names the key, the value and the fix). A ValueError too, for library users."""
