"""``aiter-mla bench``: the main job (see commands.py)."""
