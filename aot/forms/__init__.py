"""The forms IREE runs well: each op IREE compiles badly or inexactly rewritten to the
same arithmetic (``compiled_forms.emit``, one entry point over the ``*_rewrites``
modules; ``compiled_forms.apply``, the pass over a partitioned graph), with the node
helpers they share (``rewrite_nodes``). The IREE backend writes the ops it compiles in
them (``aot.backend.lower``) and the partition's cost probe measures them so; a portable
export keeps the ops as written but for the exact rewrites."""
