"""The studies' library: a frozen ``StudyConfig`` whose defaults are the resolution study's (``config``), its
data and crops (``data``), typed test specifications (``specs``), the resumable trainer with its tests and
position probe (``trainer``), the report that renders results as Markdown, CSV, JSON and figures (``report``),
the convolutional stem variants can share (``stem``),
the CNN control (``cnn``) and what every study shares: paired statistics, run metadata, sharding (``common``).
``benchmarks.resolution_study``, ``recipe_sweep`` and ``native_detail`` are command lines over it."""
