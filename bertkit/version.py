"""bertkit's version, below every other module (the model card and the reports name it)."""

__version__ = "0.1.0"
