"""The package version (a leaf module: submodules read it without importing ``aiter_mla``'s
``__init__``, whose lazy attributes import the ops)."""
__version__ = "0.1.0"
