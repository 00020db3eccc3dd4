"""The resolution verdict's tables (and the demo's), rendered from the committed result files, one training device
per comparison.

    python -m benchmarks.verdict            # print every table
    python -m benchmarks.verdict --write    # and rewrite them where README.md and docs/ hold them

Every table compares runs trained on one device: a study whose runs trained on several is split by device, and a
table says which. Differences are paired by seed (``benchmarks.study.common.paired``): the mean, and the 95% t interval
over seeds; a difference is called (a leader, an agreeing paper pair, "loses more") only where the interval
excludes zero, otherwise it is tied or undecided. The documents hold each table between
``<!-- verdict:NAME -->`` and ``<!-- /verdict:NAME -->``; ``tests/test_verdict.py`` renders them again from
the result files and compares.

The tables are declared, not coded: ``BLOCKS`` lists each as a ``Block`` (its name, the comparison, what it reads:
a ``Study``'s runs on one device as a typed ``Summary``, a ``Dense`` or ``Native`` study as its typed summary, a
``Record`` as written, a ``Recipe``), and ``render``, the one renderer, loads the inputs and calls the comparison;
every table goes through ``table``. A new table is one ``Block`` in ``blocks.py`` (and, for a new kind of
comparison, one function of typed summaries).
"""
