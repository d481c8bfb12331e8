"""The one exception of the config tree, in a module of its own so every other module can import it."""


class ConfigError(ValueError):
    """A config value or combination that cannot work; the message names the fields and the fix."""
