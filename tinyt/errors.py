"""Every exception type tinyt raises, in one list. Each TinytError names the bad value, what is
allowed and what to do; the CLI turns one into exit 2 and one line (tinyt.app.cli.run).

By floor: the core (config, data, checkpoints, manifests, graph files, Hugging Face conversion,
int8 exactness), the runtime (providers, the engine's queue), export (one per stage) and the
server's HTTP answers."""


class TinytError(Exception):
    """Base class of tinyt's documented errors."""


class ConfigError(TinytError, ValueError):
    """A configuration value, or an argument of a call (a prompt, token ids, a sampling or
    batch setting), is invalid."""


class DataError(TinytError, ValueError):
    """A corpus or data set is missing, empty or unusable."""


class CheckpointError(TinytError, ValueError):
    """A checkpoint directory or an imported checkpoint file is missing, corrupt or mismatched."""


class NonFiniteError(TinytError, ValueError):
    """A weight, a loss or a model output is NaN or infinite."""


class SaturationError(TinytError, RuntimeError):
    """An int8 graph whose u8 x s8 products would saturate on this CPU (tinyt.int8), refused
    before it runs rather than giving wrong outputs."""


# The core
class ManifestError(TinytError, ValueError):
    """An artifact directory does not match its manifest (tampered, truncated or incomplete)."""


class GraphError(TinytError, ValueError):
    """A model file is not a readable ONNX model."""


class ConversionError(TinytError, ValueError):
    """A model cannot be carried between tinyt's and Hugging Face's GPT-2 layouts."""


# The runtime (tinyt.runtime)
class ProviderError(TinytError, RuntimeError):
    """The requested execution provider is not available or did not initialise."""


class QueueFull(TinytError, RuntimeError):
    """The engine's queue holds max_queue requests already."""


class MemoryLimitError(TinytError, MemoryError):
    """An allocation does not fit this machine's memory: refused before it is made where its
    size is known (KV buffers: rows x tokens), or ONNX Runtime failed to make it; the message
    names the size where known and what to lower."""


# What ONNX Runtime, numpy and torch say when an allocation fails (ORT's RuntimeException /
# Fail "Failed to allocate memory for requested buffer of size N", numpy's "Unable to allocate
# 824. GiB for an array", torch's "DefaultCPUAllocator: can't allocate memory").
_ALLOCATION_FAILURES = ("Failed to allocate memory", "Unable to allocate", "can't allocate memory",
                        "bad_alloc", "std::bad_alloc")


def memory_failure(e: BaseException) -> MemoryLimitError | None:
    """A failed allocation deep in a library as one line naming it (and the size where the
    library says it), else None."""
    text = str(e)
    if not (isinstance(e, MemoryError) or any(s in text for s in _ALLOCATION_FAILURES)):
        return None
    line = next((ln.strip() for ln in text.splitlines()
                 if any(s in ln for s in _ALLOCATION_FAILURES)), text.splitlines()[0] if text
                else type(e).__name__)
    return MemoryLimitError(f"an allocation failed ({line[:300]}): this machine has not the "
                            "memory for it; lower the batch, the sequence length or the context "
                            "(--max-context, import-hf --context)")


# Export stages (tinyt.export)
class ExportError(TinytError, ValueError):
    """The export cannot be done as asked."""


class VerificationError(TinytError, ValueError):
    """The artifact cannot be verified against this checkpoint (wrong model, wrong I/O)."""


class OptimizeError(TinytError, ValueError):
    """The graph cannot be optimized as asked."""


class SharedCacheError(TinytError, ValueError):
    """The graph cannot be turned into the shared-cache layout."""


class QuantizeError(TinytError, ValueError):
    """The graph cannot be quantized as asked."""


class PackageError(TinytError, ValueError):
    """The artifact cannot be packaged as asked."""


class TritonError(TinytError, ValueError):
    """The model repository cannot be written or does not describe the graph."""


class WebPackageError(TinytError, ValueError):
    """The artifact cannot be packaged for the web as asked."""


# Benchmarks (tinyt.benchmarks)
class BenchError(TinytError, ValueError, RuntimeError):
    """A benchmark cannot run as asked: an unknown engine or variant, a missing artifact, an
    engine that could not start or answer."""


# The HTTP server (tinyt.server)
class ApiError(Exception):
    """An HTTP error answer of `tinyt serve` (status, OpenAI error body): not a TinytError, the
    server turns it into a response and never lets it reach a caller."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}
