"""Example services shipped with the project: ``echo`` and ``kv``."""
