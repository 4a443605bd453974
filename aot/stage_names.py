"""The stages the pipeline can stop at and emit, in pipeline order (``aot.stages``,
``aot compile --emit``): a module of its own, so the command line knows them without
importing the compiler."""

__all__ = ["EMIT"]

EMIT = ("torch", "partitioned", "stablehlo", "vmfb")
