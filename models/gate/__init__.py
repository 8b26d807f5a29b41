"""What a variant must pass before it is published: its scores measured through the runtime's own
engine, calibration, and the golden set it must answer as recorded."""
