"""Operations on a padded batch of maps that give each image what the operation gives its own map alone.

Each (B, C, H, W) map comes with its images' region sizes ``cells``: a (B, 2) int64 tensor, image b owning rows
< ``cells[b, 0]`` and columns < ``cells[b, 1]`` (the size of its map alone at that point of its computation).
The maps these functions take are zero beyond each region, and so are the maps they return (``replicate_edge``
excepted). Tensor operations only, with per-image index tensors where an operation reads another place of each
image's map (no Python number is taken from ``cells``): they trace with dynamic batch and map sizes and the sizes
as a tensor input.

``resize`` reproduces ``F.interpolate``'s source positions for each image's (input, output) pair, in the same
float arithmetic (float32 for float32 maps), ``group_norm`` takes GroupNorm's statistics over each region only,
``adaptive_avg_pool`` pools each region with PyTorch's bins, ``replicate_edge`` fills the padding with each
image's edge, as mmcv's RoIAlign clamps its samples to a map's last row and column.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def ceil_cells(sizes: torch.Tensor, stride: int) -> torch.Tensor:
    """(B, 2) the cells of a stride-``stride`` map over images of ``sizes`` pixels: ceil(size / stride)."""
    return torch.div(sizes + stride - 1, stride, rounding_mode='floor')


def full_cells(x: torch.Tensor) -> torch.Tensor:
    """(B, 2) cells covering the whole (B, C, H, W) map ``x`` for every image."""
    hw = torch.tensor(x.shape[-2:], dtype=torch.int64, device=x.device)
    return hw.expand(x.shape[0], 2)


def conv_cells(cells: torch.Tensor, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
               dilation: Sequence[int] = (1, 1)) -> torch.Tensor:
    """(B, 2) the cells a convolution or pooling of these (per-dimension) parameters makes of a map of ``cells``:
    floor((n + 2p - d (k - 1) - 1) / s) + 1, the size of its output alone."""
    k, s, p, d = (torch.tensor(list(v), dtype=torch.int64, device=cells.device)
                  for v in (kernel, stride, padding, dilation))
    return torch.div(cells + 2 * p - d * (k - 1) - 1, s, rounding_mode='floor') + 1


def region_mask(cells: torch.Tensor, hw: Sequence[int]) -> torch.Tensor:
    """(B, 1, H, W) bool, True on each image's region of an ``hw`` map."""
    rows = torch.arange(hw[0], device=cells.device)[None, :] < cells[:, :1]
    cols = torch.arange(hw[1], device=cells.device)[None, :] < cells[:, 1:]
    return (rows[:, :, None] & cols[:, None, :])[:, None]


def zero_beyond(x: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
    """The (B, C, H, W) map ``x`` with everything beyond each image's region set to zero."""
    return x.masked_fill(~region_mask(cells, x.shape[-2:]), 0)


def _index_dtype(x: torch.Tensor) -> torch.dtype:
    """The float type PyTorch's interpolation computes source positions in for ``x``: its accumulation type
    (float32 for float32 and lower precisions, float64 for float64)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _sources(n_in: torch.Tensor, n_out: torch.Tensor, length: int, mode: str, align_corners: bool,
             scale_factor: float | None, dtype: torch.dtype):
    """For each image (``n_in``, ``n_out``: (B,) int64) and each of ``length`` output positions: the source
    indices (B, length) ``i0``, ``i1`` and the weight ``l1`` of ``i1`` (None for 'nearest'), as PyTorch's
    ``upsample_nearest`` / ``upsample_bilinear2d`` compute them for that (input, output) pair; positions past
    ``n_out`` get in-range indices (their outputs are zeroed)."""
    dst = torch.arange(length, device=n_in.device).to(dtype)[None, :]
    last = (n_in - 1)[:, None]
    n_in_f, n_out_f = n_in.to(dtype)[:, None], n_out.to(dtype)[:, None]
    if mode == 'bilinear' and align_corners:
        scale = torch.where(n_out_f > 1, (n_in_f - 1) / (n_out_f - 1).clamp(min=1), torch.zeros_like(n_in_f))
    elif scale_factor is not None:
        scale = torch.tensor(1.0 / scale_factor, dtype=torch.float64).to(dtype)
    else:
        scale = n_in_f / n_out_f
    if mode == 'nearest':
        return torch.floor(dst * scale).to(torch.int64).minimum(last), None, None
    if align_corners:
        src = scale * dst
    else:   # scale * (dst + 0.5) - 0.5 rounded once, as PyTorch's kernels compute it (a fused multiply-add)
        src = (scale.to(torch.float64) * (dst.to(torch.float64) + 0.5) - 0.5).to(dtype).clamp(min=0)
    i0 = torch.floor(src).to(torch.int64).minimum(last)
    l1 = (src - i0.to(dtype)).clamp(0, 1)
    i1 = i0 + (i0 < last).to(torch.int64)
    return i0, i1, l1


def _rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The channels-last ``x`` (B, H, W, C) read at the per-image rows ``index`` (B, L): (B, L, W, C)."""
    return x[torch.arange(x.shape[0], device=x.device)[:, None], index]


def _columns(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The channels-last ``x`` (B, H, W, C) read at the per-image columns ``index`` (B, L): (B, H, L, C)."""
    B, H = x.shape[:2]
    return x[torch.arange(B, device=x.device)[:, None, None], torch.arange(H, device=x.device)[None, :, None],
             index[:, None, :]]


def _interpolate_dim(x: torch.Tensor, n_in: torch.Tensor, n_out: torch.Tensor, length: int, dim: int, mode: str,
                     align_corners: bool, scale_factor: float | None) -> torch.Tensor:
    """One side (``dim`` 1: rows, 2: columns) of the channels-last ``x`` (B, H, W, C) resized per image."""
    i0, i1, l1 = _sources(n_in, n_out, length, mode, align_corners, scale_factor, _index_dtype(x))
    read = _rows if dim == 1 else _columns
    if l1 is None:
        return read(x, i0)
    l1 = l1.to(x.dtype)
    l1 = l1[:, :, None, None] if dim == 1 else l1[:, None, :, None]
    return read(x, i0) * (1 - l1) + read(x, i1) * l1


RESIZE_MODES = ('nearest', 'bilinear')


def resize(x: torch.Tensor, cells: torch.Tensor, out_cells: torch.Tensor, out_hw: Sequence[int],
           mode: str = 'nearest', align_corners: bool | None = None,
           scale_factor: float | None = None) -> torch.Tensor:
    """Each image's region of ``x`` (``cells``) resized to ``out_cells`` as ``F.interpolate`` resizes that
    region alone, placed top-left in a (B, C, *out_hw) map, zero beyond: ``F.interpolate(region, size=out,
    mode=mode, align_corners=align_corners)``, or, with ``scale_factor`` (one number for both sides), as
    ``F.interpolate(region, scale_factor=scale_factor, ...)`` computes its source positions (from 1 /
    ``scale_factor``, not from the sizes; ``out_cells`` must then be floor(cells * scale_factor), the size it
    gives). ``mode``: 'nearest' (PyTorch's 'nearest', floor of dst * scale) or 'bilinear' (``align_corners``
    False or True). The output regions must fit ``out_hw``."""
    if mode not in RESIZE_MODES:
        raise ValueError(f'resize takes mode {RESIZE_MODES}, got {mode!r}')
    if mode == 'nearest' and align_corners:
        raise ValueError('align_corners applies to bilinear resizing only (F.interpolate refuses it for nearest)')
    align = bool(align_corners)   # columns first: each output row weighs two interpolated rows, as PyTorch's
    y = _interpolate_dim(x.permute(0, 2, 3, 1), cells[:, 1], out_cells[:, 1], out_hw[1], 2, mode, align, scale_factor)
    y = _interpolate_dim(y, cells[:, 0], out_cells[:, 0], out_hw[0], 1, mode, align, scale_factor)
    return zero_beyond(y.permute(0, 3, 1, 2).contiguous(), out_cells)


def group_norm(x: torch.Tensor, cells: torch.Tensor, num_groups: int, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """``F.group_norm`` of each image's region alone (mean and biased variance over the region of each group's
    channels), zero beyond."""
    B, C, H, W = x.shape
    if C % num_groups:
        raise ValueError(f'group_norm: {C} channels do not split into {num_groups} groups')
    mask = region_mask(cells, (H, W)).to(x.dtype)
    count = (cells.prod(dim=1).to(x.dtype) * (C // num_groups))[:, None, None, None]
    groups = (x * mask).reshape(B, num_groups, C // num_groups, H, W)
    mean = groups.sum(dim=(2, 3, 4), keepdim=True) / count[..., None]
    centred = (x.reshape(B, num_groups, C // num_groups, H, W) - mean) * mask[:, None]
    var = (centred * centred).sum(dim=(2, 3, 4), keepdim=True) / count[..., None]
    y = (centred * torch.rsqrt(var + eps)).reshape(B, C, H, W)
    if weight is not None:
        y = y * weight[None, :, None, None]
    if bias is not None:
        y = y + bias[None, :, None, None]
    return zero_beyond(y, cells)


def _bins(n: torch.Tensor, out: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, out, length) the averaging weights of PyTorch's adaptive pooling of each image's ``n`` (B,) cells
    into ``out`` bins: bin i covers [floor(i n / out), ceil((i + 1) n / out)), each cell 1 / its length."""
    i = torch.arange(out, device=n.device)[None, :, None]
    n = n[:, None, None]
    start = torch.div(i * n, out, rounding_mode='floor')
    end = torch.div((i + 1) * n + out - 1, out, rounding_mode='floor')
    pos = torch.arange(length, device=n.device)[None, None, :]
    inside = (pos >= start) & (pos < end)
    return inside.to(dtype) / (end - start).to(dtype)


def adaptive_avg_pool(x: torch.Tensor, cells: torch.Tensor, output_size: int | Sequence[int]) -> torch.Tensor:
    """(B, C, oh, ow): ``F.adaptive_avg_pool2d`` of each image's region alone (``output_size`` as it takes it:
    an int or an (oh, ow) pair; None for a side is refused)."""
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    if oh is None or ow is None:
        raise ValueError(f'adaptive_avg_pool takes a full output size, got {output_size!r}')
    rows = _bins(cells[:, 0], oh, x.shape[-2], x.dtype)
    cols = _bins(cells[:, 1], ow, x.shape[-1], x.dtype)
    return torch.einsum('bih,bchw,bjw->bcij', rows, x, cols)


def replicate_edge(x: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
    """``x`` with every place beyond each image's region holding the nearest place of the region (its last row
    and column repeated): bilinear samples that mmcv's RoIAlign clamps to the last row or column of an image's
    map alone read the same values on the padded map, where they fall between that row and the next."""
    H, W = x.shape[-2:]
    rows = torch.arange(H, device=x.device)[None, :].minimum(cells[:, :1] - 1)
    cols = torch.arange(W, device=x.device)[None, :].minimum(cells[:, 1:] - 1)
    return _columns(_rows(x.permute(0, 2, 3, 1), rows), cols).permute(0, 3, 1, 2).contiguous()


__all__ = ['RESIZE_MODES', 'adaptive_avg_pool', 'ceil_cells', 'conv_cells', 'full_cells', 'group_norm',
           'region_mask', 'replicate_edge', 'resize', 'zero_beyond']
