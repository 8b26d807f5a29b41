"""decide model factory (dev-time only: torch/transformers live here, never in the bundle)."""
