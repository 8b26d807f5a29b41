"""One path from a model to a package on disk: gate, abstention (scope, novelty), golden set,
the manifest written through runtime/package/manifest.py, staged and swapped into place."""
