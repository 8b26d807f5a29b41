"""The int8 variants, made from the FP32 graph with fixed calibrated activation scales
(`python -m models.quantize PACKAGE` re-quantizes a package: __main__.py)."""
