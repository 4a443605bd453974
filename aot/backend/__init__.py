"""The backend: a partitioned program compiled by IREE (``aot.toolchain``) into the
artifact (``build``), and whether a program is worth a data-tiled compile too
(``tiling``)."""
