"""The studies' library: a frozen ``StudyConfig`` whose defaults are the resolution study's (``config``), its
data, crops and blur-up (``data``), typed test specifications (``specs``), the resumable trainer with its tests and
position probe (``trainer``), the report that renders results as Markdown, CSV, JSON and figures (``report``),
the convolutional stem variants can share (``stem``), the CNN control (``cnn``), scenes drawn natively at any size
and the object sizes crops and tests show (``scenes``), runs spread over processes that share the drawn images
(``pool``), paired intervals at any confidence with Holm's correction (``stats``) and what every study shares:
paired statistics, run metadata, provenance, sharding (``common``; the grid of runs, ``grid``).
``benchmarks.resolution_study``, ``recipe_sweep``, ``native_detail`` and ``confirm_detail`` are command lines over
it."""
