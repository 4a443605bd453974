"""The measuring loop on top of the pipeline: ``compile.compile_model`` partitions and
compiles, recovers from IREE failures (``recover``), builds variants, and times the
candidates end to end on the example (``regions``, ``specialize``); ``plain_module``
builds a plain IREE module on it."""
