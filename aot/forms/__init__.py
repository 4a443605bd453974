"""The forms IREE runs well: each op IREE compiles badly or inexactly rewritten to the
same arithmetic (``compiled_forms.emit``, one entry point over the ``*_rewrites``
modules), with the node helpers they share (``rewrite_nodes``). The partition emits
them for the ops it compiles, and measures them so; a portable export keeps the ops as
written but for the exact rewrites."""
