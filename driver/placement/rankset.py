"""A growable set of small non-negative integers with O(log64 n) add, discard and successor.

The placement indexes keep, per profile signature, the set of node *ranks* (positions in name order)
that could host it; "first node at or after rank r" must not scan the cluster. A 64-ary tree of
machine-word bitmaps answers that in a handful of Python operations for 10,000 nodes (three levels),
and an empty set answers in one.
"""

_WORD = 64
_SHIFT = 6
_LOW = _WORD - 1


def _lowest_bit(word: int) -> int:
    return (word & -word).bit_length() - 1


class RankSet:
    """Set of ints ``>= 0``; ``next_at_or_after(r)`` is the smallest member ``>= r`` or ``-1``."""

    __slots__ = ("_levels", "_size")

    def __init__(self) -> None:
        # _levels[0] holds one bit per member; _levels[k + 1] one bit per non-zero word of _levels[k].
        self._levels: list[list[int]] = [[0]]
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __contains__(self, rank: int) -> bool:
        words = self._levels[0]
        index = rank >> _SHIFT
        return 0 <= index < len(words) and bool(words[index] >> (rank & _LOW) & 1)

    def __iter__(self) -> "RankSetIterator":
        return RankSetIterator(self)

    def _grow(self, rank: int) -> None:
        needed = (rank >> _SHIFT) + 1
        level = 0
        while True:
            words = self._levels[level]
            if len(words) < needed:
                words.extend([0] * (needed - len(words)))
            if needed == 1:
                break
            needed = ((needed - 1) >> _SHIFT) + 1
            level += 1
            if level == len(self._levels):
                # A new top level summarises the level below, which may already hold members.
                below = self._levels[level - 1]
                top = [0] * needed
                for i, word in enumerate(below):
                    if word:
                        top[i >> _SHIFT] |= 1 << (i & _LOW)
                self._levels.append(top)

    def add(self, rank: int) -> None:
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        if (rank >> _SHIFT) >= len(self._levels[0]):
            self._grow(rank)
        if self._levels[0][rank >> _SHIFT] >> (rank & _LOW) & 1:
            return
        self._size += 1
        position = rank
        for words in self._levels:
            index = position >> _SHIFT
            word = words[index]
            words[index] = word | (1 << (position & _LOW))
            if word:
                # The word was already non-empty, so every level above already marks it.
                break
            position = index

    def discard(self, rank: int) -> None:
        words0 = self._levels[0]
        index0 = rank >> _SHIFT
        if rank < 0 or index0 >= len(words0) or not (words0[index0] >> (rank & _LOW) & 1):
            return
        position = rank
        for words in self._levels:
            index = position >> _SHIFT
            word = words[index] & ~(1 << (position & _LOW))
            words[index] = word
            if word:
                break
            position = index
        self._size -= 1

    def first(self) -> int:
        return self.next_at_or_after(0)

    def next_at_or_after(self, rank: int) -> int:
        """The smallest member ``>= rank``, or ``-1`` if there is none."""
        if self._size == 0:
            return -1
        rank = max(rank, 0)
        levels = self._levels
        depth = len(levels)
        position = rank
        level = 0
        # Climb until a word holds a member at or after the position, then descend to its lowest bit.
        while level < depth:
            words = levels[level]
            index = position >> _SHIFT
            if index >= len(words):
                return -1
            word = words[index] >> (position & _LOW)
            if word:
                position += _lowest_bit(word)
                break
            position = index + 1
            level += 1
        else:
            return -1
        while level > 0:
            level -= 1
            position = (position << _SHIFT) + _lowest_bit(levels[level][position])
        return position


class RankSetIterator:
    """Members in increasing order; tolerates members being removed behind the cursor."""

    __slots__ = ("_cursor", "_set")

    def __init__(self, rank_set: RankSet) -> None:
        self._set = rank_set
        self._cursor = 0

    def __iter__(self) -> "RankSetIterator":
        return self

    def __next__(self) -> int:
        rank = self._set.next_at_or_after(self._cursor)
        if rank < 0:
            raise StopIteration
        self._cursor = rank + 1
        return rank
