"""Kernel calls: their recorded specs, the static-operand contract and the ATen executor."""
