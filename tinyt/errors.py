"""Exception types. Every error tinyt raises on bad input is one of these, with a message that
names the bad value, what is allowed, and what to do."""


class TinytError(Exception):
    """Base class of tinyt's documented errors."""


class ConfigError(TinytError, ValueError):
    """A configuration value is invalid."""


class DataError(TinytError, ValueError):
    """A corpus or data set is missing, empty or unusable."""


class CheckpointError(TinytError, ValueError):
    """A checkpoint directory or an imported checkpoint file is missing, corrupt or mismatched."""


class NonFiniteError(TinytError, ValueError):
    """A weight, a loss or a model output is NaN or infinite."""


class SaturationError(TinytError, RuntimeError):
    """An int8 graph whose u8 x s8 products would saturate on this CPU (tinyt.int8), refused
    before it runs rather than giving wrong outputs."""
