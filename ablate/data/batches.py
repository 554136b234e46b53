"""Batches: ``BatchSampler`` (a seeded permutation of non-overlapping windows per epoch, resumable
from ``state_dict()``) and ``val_batches`` (the fixed validation batches)."""

from __future__ import annotations

import hashlib

import torch


class BatchSampler:
    """Training batches of random non-overlapping windows: window ``i`` is ``x = tokens[i*T:(i+1)*T]``
    and ``y`` the same shifted by one. Each epoch visits every window once, in a permutation drawn
    from a generator seeded by ``(data_seed, epoch)``; a batch may straddle two epochs.

    ``state_dict()`` holds (epoch, position in the epoch's permutation), so a resumed run sees exactly
    the batches an uninterrupted one would.
    """

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch_size: int, data_seed: int) -> None:
        if tokens.dim() != 1:
            raise ValueError(f"tokens: expected a 1-D tensor, got shape {tuple(tokens.shape)}")
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len and batch_size must be >= 1, got {seq_len} and {batch_size}")
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.data_seed = data_seed
        self.n_windows = (tokens.numel() - 1) // seq_len  # each needs seq_len + 1 tokens
        if self.n_windows < batch_size:
            raise ValueError(
                f"the training split has {tokens.numel()} tokens: {self.n_windows} windows of "
                f"seq_len {seq_len} (+1 target token), fewer than batch_size {batch_size}; use a "
                "larger corpus or lower data.val_tokens, seq_len or batch_size"
            )
        self.epoch = 0
        self.position = 0
        self._perm = self._permutation(0)

    @property
    def tokens_per_batch(self) -> int:
        return self.batch_size * self.seq_len

    def _permutation(self, epoch: int) -> torch.Tensor:
        digest = hashlib.sha256(f"{self.data_seed}:{epoch}".encode()).digest()
        g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        return torch.randperm(self.n_windows, generator=g)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``(x, y)``: int64 ``(batch_size, seq_len)`` on the CPU."""
        starts: list[int] = []
        while len(starts) < self.batch_size:
            if self.position == self.n_windows:
                self.epoch, self.position = self.epoch + 1, 0
                self._perm = self._permutation(self.epoch)
            take = min(self.batch_size - len(starts), self.n_windows - self.position)
            window = self._perm[self.position : self.position + take]
            starts.extend((window * self.seq_len).tolist())
            self.position += take
        T = self.seq_len
        rows = torch.stack([self.tokens[s : s + T + 1] for s in starts]).to(torch.int64)  # (B, T+1)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def __iter__(self) -> BatchSampler:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next()

    def state_dict(self) -> dict[str, int]:
        """Where the sampler is, plus what must match for the position to mean the same batches."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "data_seed": self.data_seed,
            "seq_len": self.seq_len,
            "n_windows": self.n_windows,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        mine = self.state_dict()
        for k in ("data_seed", "seq_len", "n_windows"):
            if state.get(k, mine[k]) != mine[k]:
                raise ValueError(
                    f"sampler state: saved with {k}={state[k]}, this run has {k}={mine[k]}; "
                    "resuming would not replay the same batches"
                )
        if not 0 <= state["position"] <= self.n_windows:
            raise ValueError(
                f"sampler state: position {state['position']} outside 0..{self.n_windows}"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._perm = self._permutation(self.epoch)


def val_batches(
    val_tokens: torch.Tensor, seq_len: int, batch_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed validation batches: non-overlapping windows in order, the tokens that do not fill a
    window dropped. The last batch holds the remaining windows and may be smaller than
    ``batch_size``; weight by ``x.numel()`` when averaging. Empty if not even one window fits."""
    n = (val_tokens.numel() - 1) // seq_len
    if n < 1:
        return []
    v = val_tokens[: n * seq_len + 1].to(torch.int64)
    x, y = v[:-1].view(n, seq_len), v[1:].view(n, seq_len)  # (n, T) each
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n, batch_size)]
