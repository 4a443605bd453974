"""Import stage: nn.Module -> ImportedProgram (torch.export + FX importer)."""

from .program import ImportedProgram, ImportOptions, import_model

__all__ = ["ImportedProgram", "ImportOptions", "import_model"]
