"""The native-detail study: resolution with real detail by construction, from matched starts. Which of four shapes
a scene shows, every image drawn natively at the size it is used at; each position-encoding variant trained at
56 px and tested on held-out scenes drawn at 56-112 px, at its final check and at a check matched on validation.

    python -m benchmarks.native_detail [--variants ...] [--seeds ...] [--shard K/N] [--name NAME] ...
        [--from STUDY --window W --test-seed S [--val-seed V --val-images N] [--match nearest]]

``design`` holds the scenes, tests and fixed settings, ``runs`` a run's training and tests, ``selection`` the
checks each analysis reads and what it finds, ``render`` the report, ``cli`` the command line (``--help``). The
design, the reasons for it and the history of its studies (native_checked, native_windowed, native_revalidated,
native_matched) are in docs/resolution_study.md.
"""
