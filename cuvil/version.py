"""cuvil's version, part of every cache key and manifest: a leaf, so that the compiler's own modules
need not import the package's face for it."""
__version__ = "0.1.0"
