"""Teacher and student in PyTorch: the e5 encoder, the decision model, the frozen word table,
distillation, the training loops, the hybrid student, and the metrics the loops report."""
