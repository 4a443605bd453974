"""Graph passes on the exported program before it is partitioned, for every target and
export: batch norm folded into convolutions, constant subgraphs folded, bool fills made
explicit (``prepare`` runs them)."""
