"""Compile side: partition (placement + outlining) and IREE compilation."""
