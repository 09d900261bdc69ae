"""Enumeration helpers of the single-shape (Metis/AMP) baseline: TP-group splits and Metis's group orders.

Every function here is iterative (no recursion per device: a type of 4,096 GPUs is as safe as
one of 4) and lazy where the count can explode. :mod:`hpp.baselines.single_shape` uses them; they live apart
to keep that module about one concept (the baselines themselves).

Preconditions: group sizes are positive integers (TP degrees).
"""

from __future__ import annotations

from typing import Iterator, Sequence

__all__ = ["group_splits", "iter_group_splits", "min_groups", "metis_merged_blocks", "distinct_permutations",
           "group_orders", "type_orders", "lazy_product"]


def min_groups(n: int, sizes: Sequence[int]) -> int:
    """Fewest groups of the given sizes [devices] that ``n`` devices can be cut into (a lower bound).

    ``ceil(n / max(sizes))``: exact when the largest size divides ``n`` or 1 is a size; otherwise a
    bound (no split may exist at all).

    Examples
    --------
    >>> min_groups(10, [1, 2, 4])
    3
    """
    return -(-n // max(sizes))


def iter_group_splits(n: int, sizes: Sequence[int], *, max_groups: int | None = None) -> Iterator[tuple[int, ...]]:
    """Ways to cut ``n`` devices into groups of the given sizes, each a non-increasing tuple.

    Parameters
    ----------
    n : int
        Devices to cut, >= 0.
    sizes : sequence of int
        Allowed group sizes [devices] (TP degrees), positive; duplicates are ignored.
    max_groups : int, optional
        Yield only splits of at most this many groups (the others are never built).

    Yields
    ------
    tuple of int
        Group sizes, largest first, in lexicographic order of the tuples (smallest first): the order
        of the recursive enumeration this replaces (try the sizes ascending at every position).

    Notes
    -----
    A non-increasing tuple is a count per size. Comparing two of them lexicographically, the one
    with fewer groups of the largest size comes first, then fewer of the next largest, and so on,
    so nested loops over those counts (largest size outermost, ascending) yield the same order as
    the recursion without its depth of one frame per group. With ``max_groups`` a count is skipped
    when what is left cannot fit in the groups left.

    Examples
    --------
    >>> list(iter_group_splits(4, [1, 2]))
    [(1, 1, 1, 1), (2, 1, 1), (2, 2)]
    >>> list(iter_group_splits(8, [1, 2, 4], max_groups=2))
    [(4, 4)]
    """
    desc = sorted(set(sizes), reverse=True)
    cap = n if max_groups is None else max_groups
    if n == 0:
        yield ()
        return
    if not desc or cap < 0:
        return
    counts = [0] * len(desc)
    # depth-first over the counts: level k chooses counts[k] for size desc[k]; the last level is forced
    stack: list[tuple[int, int, int, int]] = [(0, n, cap, 0)]      # (level, left, groups left, next count)
    while stack:
        k, left, room, c = stack.pop()
        s = desc[k]
        if k == len(desc) - 1:                     # smallest size: the rest must be a whole number of it
            if left % s == 0 and left // s <= room:
                counts[k] = left // s
                yield tuple(x for size, cnt in zip(desc, counts) for x in [size] * cnt)
            continue
        smaller = desc[k + 1]
        while c * s <= left and c <= room:
            rest, rest_room = left - c * s, room - c
            if -(-rest // smaller) <= rest_room:    # the rest fits in the groups left (sizes <= smaller)
                counts[k] = c
                stack.append((k, left, room, c + 1))  # resume this level after the subtree
                stack.append((k + 1, rest, rest_room, 0))
                break
            c += 1


def group_splits(n: int, sizes: Sequence[int], *, max_groups: int | None = None) -> list[tuple[int, ...]]:
    """:func:`iter_group_splits` as a list (small ``n`` or a ``max_groups`` bound only: the count grows as n^2)."""
    return list(iter_group_splits(n, sizes, max_groups=max_groups))


def metis_merged_blocks(groups: tuple[int, ...], max_permute_len: int) -> list[tuple[int, ...]]:
    """Metis's "Key idea 2": merge the smallest equal groups pairwise to bound the permutation length.

    Parameters
    ----------
    groups : tuple of int
        Device-group sizes [devices] of one split, in any order.
    max_permute_len : int
        Upper bound on the number of blocks to permute (Metis's scripts use 4); >= 1.

    Returns
    -------
    list of tuple of int
        The blocks: each a run of group sizes [devices] that stays together along the pipeline.

    Notes
    -----
    The rule of SamsungLabs/Metis ``search_space/device_group.py`` (``permute``), restated: the
    groups start as one block each, in non-decreasing size. While there are more than
    ``max_permute_len`` blocks, one pass walks the blocks in pairs (0, 1), (2, 3), ... and merges a
    pair when both blocks sum to the smallest block's sum (the first block's), for at most
    ``max(excess, lead // 2)`` pairs, where ``excess`` is the number of blocks over the limit and
    ``lead`` is the number of leading blocks equal to the first one plus one (Metis counts up to and
    including the first differing block; all blocks when none differs). Blocks past the last pair
    tried stay as they are. The loop stops when a pass leaves the excess equal to the number of pairs
    it was allowed to merge (nothing more to merge) or the limit is met. Merged blocks keep their
    members' order (non-decreasing).

    Examples
    --------
    >>> metis_merged_blocks((2, 1, 1), 4)
    [(1,), (1,), (2,)]
    """
    blocks = [(g,) for g in sorted(groups)]
    excess = len(blocks) - max_permute_len
    while excess > 0:
        smallest = sum(blocks[0])
        first_other = next((i for i, blk in enumerate(blocks) if blk != blocks[0]), None)
        lead = len(blocks) if first_other is None else first_other + 1
        pairs = max(excess, lead // 2)
        merged: list[tuple[int, ...]] = []
        for i in range(0, len(blocks), 2):
            if i // 2 >= pairs:
                merged.extend(blocks[i:])
                break
            if i + 1 < len(blocks) and sum(blocks[i]) == smallest == sum(blocks[i + 1]):
                merged.append(blocks[i] + blocks[i + 1])
            else:
                merged.extend(blocks[i:i + 2])
        blocks = merged
        if pairs == len(blocks) - max_permute_len:
            break
        excess = len(blocks) - max_permute_len
    return blocks


def distinct_permutations(items: list[tuple[int, ...]]) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Every distinct ordering of the multiset ``items``, in decreasing lexicographic order (iterative).

    Examples
    --------
    >>> list(distinct_permutations([(1,), (2,), (1,)]))
    [((2,), (1,), (1,)), ((1,), (2,), (1,)), ((1,), (1,), (2,))]
    """
    seq = sorted(items, reverse=True)
    while True:
        yield tuple(seq)
        # step to the lexicographically previous arrangement; stop after the non-decreasing one
        i = len(seq) - 2
        while i >= 0 and seq[i] <= seq[i + 1]:
            i -= 1
        if i < 0:
            return
        j = len(seq) - 1
        while seq[j] >= seq[i]:
            j -= 1
        seq[i], seq[j] = seq[j], seq[i]
        seq[i + 1:] = reversed(seq[i + 1:])


def group_orders(groups: tuple[int, ...], max_permute_len: int) -> Iterator[tuple[int, ...]]:
    """Orders of one split's device groups along the pipeline, as Metis's generator enumerates them.

    Parameters
    ----------
    groups : tuple of int
        Device-group (TP) sizes [devices] of one split.
    max_permute_len : int
        Metis's bound on the permutation length (see :func:`metis_merged_blocks`).

    Yields
    ------
    tuple of int
        Stage sequences of group sizes [devices]: every distinct permutation of the merged blocks,
        flattened, the blocks in non-increasing (lexicographic) order first. A sequence that two block
        orders flatten to alike comes twice, as Metis evaluates both.

    Examples
    --------
    >>> list(group_orders((2, 1, 1), 4))
    [(2, 1, 1), (1, 2, 1), (1, 1, 2)]
    """
    for perm in distinct_permutations(metis_merged_blocks(groups, max_permute_len)):
        yield tuple(s for blk in perm for s in blk)


def type_orders(splits: list[tuple[int, ...]], max_permute_len: int | None) -> Iterator[tuple[int, ...]]:
    """Each split in turn, then each Metis order of its groups (lazily: the orders can be many);
    ``max_permute_len=None``: each split once, in its canonical (non-increasing) order."""
    for split in splits:
        if max_permute_len is None:
            yield split
        else:
            yield from group_orders(split, max_permute_len)


def lazy_product(splits: list[list[tuple[int, ...]]], max_permute_len: int | None, *,
                 max_total: int | None = None) -> Iterator[tuple[tuple[int, ...], ...]]:
    """``itertools.product`` over the types' group orders, in its order, without materialising them.

    Parameters
    ----------
    splits : list of list of tuple of int
        Per type (outermost first), its splits into groups.
    max_permute_len : int or None
        See :func:`type_orders`.
    max_total : int, optional
        Leave out the combinations of more groups than this in all (they are never built); the
        others come in the same order as without the bound.

    Notes
    -----
    Iterative: one stack of iterators, one per type, so the depth is the number of types. The inner
    types' orders are regenerated for each outer choice, so the time to the first shape stays small
    (the search's time budget is checked per shape) however many orders there are.

    Examples
    --------
    >>> list(lazy_product([[(2,), (1, 1)], [(1,)]], None, max_total=2))
    [((2,), (1,))]
    """
    k = len(splits)
    if k == 0:
        yield ()
        return
    # fewest groups the types after position i need (a split's length is its group count)
    rest_min = [0] * (k + 1)
    for i in range(k - 1, -1, -1):
        rest_min[i] = rest_min[i + 1] + min((len(s) for s in splits[i]), default=0)
    limit = max_total if max_total is not None else None
    chosen: list[tuple[int, ...]] = []
    used = [0]                                      # groups used by chosen[:i], per depth
    iters = [type_orders(splits[0], max_permute_len)]
    while iters:
        depth = len(iters) - 1
        head = next(iters[-1], None)
        if head is None:
            iters.pop()
            if chosen:
                chosen.pop()
                used.pop()
            continue
        if limit is not None and used[depth] + len(head) + rest_min[depth + 1] > limit:
            continue
        if depth == k - 1:
            yield (*chosen, head)
            continue
        chosen.append(head)
        used.append(used[depth] + len(head))
        iters.append(type_orders(splits[depth + 1], max_permute_len))
