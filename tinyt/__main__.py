"""`python -m tinyt ...` (also what `torchrun -m tinyt train ...` runs)."""
from tinyt.cli import main

main()
