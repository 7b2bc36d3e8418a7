"""Training drafter heads: self-distillation data, the training loop, `specdec train`."""
