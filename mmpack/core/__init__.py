"""The bottom layer's rules: argument validation shared by every entry point (one wording per
mistake), and the map of module paths that moved (old paths keep working, with a warning)."""

__all__: list[str] = []
