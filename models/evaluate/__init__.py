"""A published package measured on a labelled file (`python -m models evaluate`) and its
manifest as Markdown tables (`python -m models report`)."""
