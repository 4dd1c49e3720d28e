"""The shared machinery of the task recipes in ``examples/<task>/run.py``: see ``pipeline.py``."""
