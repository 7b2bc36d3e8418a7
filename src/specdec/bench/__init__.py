"""specdec bench: Spec-Bench-style evaluation of drafting methods and peers (see bench.harness)."""
