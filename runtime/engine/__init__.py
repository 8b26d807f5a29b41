"""One model call: text → token ids (text.py), the batching plan (batching.py), the warmed ONNX
Runtime session (engine.py), and the library API `Classifier` on top of them (classifier.py).
The only layer that imports numpy and onnxruntime, and only after the platform layer chose."""
