"""The speed benchmark and the studies: modules of this repository (not of the installed ``cpvt_backbones``), run
from its root as ``python -m benchmarks.<module>``; their results are kept in ``benchmarks/results/``."""
