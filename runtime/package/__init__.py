"""A model package: its manifest (files, sha256, labels, abstention policy, golden set), the
checks that every file is the one the manifest names, signatures, and the watcher that finds new
packages. Stdlib only; the factory writes packages through the same manifest code."""
