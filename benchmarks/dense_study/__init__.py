"""Resolution generalisation on the dense tasks: the position encodings against the peer a user would pick, on the
shapes data.

    python -m benchmarks.dense_study [--seeds 0 1 2] [--det-iters 300] [--seg-iters 350] [--shard K/N] [--out DIR]

RetinaNet and Semantic FPN as in the demo (configs/shapes), with five backbones that share widths
(32/64/160/256), depths (2-2-2-2), heads (1/2/5/8), MLP ratio (4) and reduction ratios (8/4/2/1):

  peg         pcpvt_tiny: a PEG after the first block of every stage
  pvt         mmdet's own PyramidVisionTransformer (PVT v1), unmodified: a learned absolute embedding per stage
              for the training scale, resized bilinearly to every input
  none        pcpvt_tiny without PEGs: no position encoding
  learned     pcpvt_tiny with our learned table per stage for the training scale, resized bicubically
  rope_mixed  pcpvt_tiny with RoPE-Mixed (Heo et al.) in every block's attention

and, asked for by name (``--variants svt svt_unmasked --name dense_svt_window_mask``: which windows the SVT
dense configs should use), two Twins-SVTs of the same widths, depths, heads and ratios, windows of 7 x 7 tokens:

  svt           the padding of every window masked out of its attention (the Twins release's dense code)
  svt_unmasked  the padded tokens taking part as keys (timm's behaviour)

The rule for the configs, fixed before those runs: they keep masked windows unless the unmasked SVT is ahead,
paired by seed with a 95% interval excluding zero, in bbox mAP or mIoU at 1x or on the mean over the resized
sizes; masking is also what keeps an image's windowed attention independent of how far its map is padded.

The detector is trained from scratch; the segmentor starts from the backbone of the detector with the same
backbone and seed (``--seg-init scratch`` trains it from scratch too), checked to load strictly. PVT's table is
made for the detector's training scale in both tasks, so it carries over whole and is resized to the
segmentor's inputs.

Every backbone has the same data (``--data``, generated there if missing), schedule and seeds. Each model is
tested at every ``--factors``: the held-out split resized (long side) to 0.5x, 0.7x, 1x, 1.5x, 2x and 3x the
training scale, at the images' native sizes, and the same held-out scenes drawn natively at F times the training
scale's long side (``drawnF``, F any of the six; ``datasets.shapes.generate_drawn_split``): bbox mAP and mIoU,
mean and standard deviation over seeds. Resumable: a finished run (trained and evaluated) is skipped, a test it
lacks is run on its final weights, an interrupted training resumes from its last checkpoint; ``--shard K/N``
takes every N-th (seed, variant) from the K-th, both tasks of it, so N single-thread processes can share the
study. Writes NAME.{json,csv,md,png} under --out once every run has finished.

``design``: the backbones, their configs and one run; ``render``: the summary, paired differences, tables and
figure; ``cli``: the invocation. The study's set-up, results and reading: docs/resolution_study.md, section 2.
"""
