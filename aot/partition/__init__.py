"""Partition: every op placed, compiled or kernel call, and why (coverage probed, costs
measured, faults by rule: ``decisions``), kernel calls grouped and recorded, and the
program imported as MLIR with them outlined (``partitioner.partition``)."""
