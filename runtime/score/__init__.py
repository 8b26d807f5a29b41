"""`decide score`: a file of records in, a file of answers out, resumable: inputs, windows,
the worker pool, outputs, and the same job on Ray Data."""
