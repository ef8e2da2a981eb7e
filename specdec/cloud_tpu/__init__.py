"""The Cloud TPU path, checked without a TPU: slices by their Cloud names, the programs the launches run (built
through the launcher's gin parsing and the trainer's step, so this package sits above both), what XLA's TPU
compiler says each needs per chip, the abstract plans beside the compiler's figures, and the verify-cost curve
predicted from the compiled programs. Nothing else in specdec imports it; `scripts/tpu_compile.py` runs it."""
