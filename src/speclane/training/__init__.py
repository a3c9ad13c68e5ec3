"""Training of draft heads by self-distillation (``speclane train-mtp``)."""
