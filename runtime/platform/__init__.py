"""The machine decide runs on, probed in pure Python before numpy or onnxruntime is imported:
the CPU and its usable cores (cgroup quota), the tier chosen from platforms/*.json, the numeric stack
that tier needs, where the app's files are, safe file opening, and keeping onnxruntime offline."""
