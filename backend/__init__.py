"""Inkling inference backends behind one contract (see DESIGN.md)."""
from .events import Error, Finished, Metrics, Started, Step
from .request import Request, SamplingParams, SpecConfig


def load_engine(model: str, backend: str = "native", device: str = "cpu", dtype: str = "float32",
                spec: SpecConfig | None = None, **options):
    """Load an engine for the checkpoint directory `model`."""
    if backend == "native":
        from .engine import NativeEngine
        return NativeEngine(model, device=device, dtype=dtype, spec=spec, **options)
    raise ValueError(f"Backend {backend!r} is not available; use 'native'.")


__all__ = ["load_engine", "Request", "SamplingParams", "SpecConfig", "Started", "Step", "Metrics", "Finished",
           "Error"]
