"""The studies' library: a frozen ``StudyConfig`` whose defaults are the resolution study's (``config``), its
data, crops and blur-up (``data``), typed test specifications (``specs``), the resumable trainer with its tests and
position probe (``trainer``), the report that renders results as Markdown, CSV, JSON and figures (``report``),
the convolutional stem variants can share (``stem``), the CNN control (``cnn``), scenes drawn natively at any size
and the object sizes crops and tests show (``scenes``), paired intervals at any confidence with Holm's correction
(``stats``), and what every study does with its runs: the grid split into shards and the skeleton that runs a shard
and reports once every run is done (``grid``), run records written whole, tied to one accelerator and to the clean
commit they came from (``records``), runs spread over processes that share the drawn images (``pool``), paired
statistics, run metadata and the common options (``common``), and the result files comparisons read (``summary``).
A study (``benchmarks.resolution_study``, ``recipe_sweep``, ``native_detail``, ``dense_study``,
``confirm_detail``) is its design, selection and rendering over it; nothing here imports a study."""
