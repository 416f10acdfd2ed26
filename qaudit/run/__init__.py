"""Stage 5, run: a few training steps with probes; one process or one stage per process."""
