"""The IREE backend: the targets and their flags, the forms IREE runs well
(``compiled_forms``), the Torch-or-StableHLO input, ``iree-compile``, and the artifact
built from its module (``build``)."""
