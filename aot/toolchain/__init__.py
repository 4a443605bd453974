"""The compilers every compiling stage calls: IREE (``iree_compile``) for a target
(``targets``, ``cpu_targets``, the data-tiling flags ``tiling_flags``), with the
``linalg_kernels`` ops IREE's CPU backend takes by name, and torch-mlir's Torch ->
StableHLO lowering (``stablehlo``). The partition probes and measures ops through
them; the backend compiles the program."""
