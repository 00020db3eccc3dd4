"""The native-detail result confirmed: every encoding trained until it learns the task, detail told from scale, one
preregistered run (``benchmarks/protocols/confirm_detail.json``).

    python -m benchmarks.confirm_detail [--protocol FILE] [--pilot] [--shard K/N] [--device cpu|cuda]
        [--tf32 off] [--jobs N] [--threads T] [--work-dir DIR] [--out DIR]
    python -m benchmarks.confirm_detail [--protocol FILE] --scales

Everything the study does comes from its protocol file (``protocol.Protocol``), read and hashed (sha256 of its
bytes): arms, seeds, recipe, scene sets, tests, analysis and the rule for each claim; the study refuses to run
without it. ``--pilot`` runs the protocol's pilot (its arms, each candidate recipe, seeds in ``PILOT_SEEDS``, the
pilot test set, under ``pilot.name``; a draft protocol will do); without it the confirmatory grid runs, only under
a protocol whose status is 'fixed'. Every run records the protocol's sha256, and a study whose runs record another
is refused: a changed protocol needs a new name. ``--scales`` prints the object sizes of training crops and tests.

Resumable and sharded (``--shard K/N``: every N-th run; a run resumes after its last finished epoch, on the
accelerator it started on); each run records the accelerator, torch's version and the clean commit it ran from
(``benchmarks.study.records.provenance``); its record (result.json, started_on.json) is kept in git, its weights
are not. Whichever invocation finds every run done writes NAME.{json,md,csv,png}, from a clean tree only,
recording the rendering commit apart from the runs'. The design and its reasons: docs/resolution_study.md.
"""
