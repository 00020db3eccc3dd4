"""The one precision vocabulary of every engine and tool: 'fp32', 'bf16', 'int8' (static or dynamic int8 is an
option of the engine, not a fourth precision)."""
PRECISIONS = ('fp32', 'bf16', 'int8')


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f'precision must be one of {PRECISIONS}, got {precision!r}')
    return precision


__all__ = ['PRECISIONS', 'check_precision']
