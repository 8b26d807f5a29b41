"""A trained model → the package's FP32 ONNX graph (fused ops, fp16 storage), the hybrid and the
transformers exports, and the shared external-data file that every variant's graph points to."""
