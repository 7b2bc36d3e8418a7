"""Runners: the target (or a draft model) behind one pass-per-call contract (see ``base``)."""
