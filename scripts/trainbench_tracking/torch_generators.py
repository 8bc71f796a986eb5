"""The inputs of the stages' PyTorch cases, drawn as the C++ stages draw theirs (kernels/runtime/random.h,
the stages' generators): parameter sets, sparse Laplacians, right-hand sides, batches, windows. A leaf: it
imports nothing of trainbench_tracking but its error type, and numpy only where an array is built."""

from __future__ import annotations

import math
import re
import struct
from typing import Dict, List, Optional, Tuple

from .errors import UsageError

M64 = (1 << 64) - 1

# The constants the C++ stages build their inputs and checks with, by name ("cg.seed_rhs"). benchsuite's
# listing carries them (generator_constants() in benches/torch_rows.cpp, from the headers that define
# them); use_constants() takes them before anything is built.
_constants: Dict[str, object] = {}


def use_constants(values: Dict[str, object]) -> None:
    _constants.clear()
    _constants.update(values)


def constant(name: str):
    """One of the listing's constants; a UsageError when the listing carries none of that name."""
    if name not in _constants:
        raise UsageError(f"the listing carries no constant {name!r} (from a benchsuite older than this script?)")
    return _constants[name]


def attention_shape(problem: Dict[str, str]) -> str:
    """BATCHxHEADSxSEQxHEAD_DIM: the CUDA variants' `shape` axis, the CPU variants' `cpu_shape`."""
    return problem["shape"] if "shape" in problem else problem["cpu_shape"]


def param_set_sizes(total: int, tensors: int) -> List[int]:
    """adamw::make_param_set's tensor sizes (kernels/adamw/param_set.cpp): a token embedding first and an
    untied head last (between them at least 1/8 of the total), and in between a transformer layer's 12
    tensors repeated, with the largest width d that fits."""
    if total < 1 or tensors < 1:
        raise UsageError(f"params and tensors must be at least 1 (got {total}, {tensors})")
    # per layer tensor: multiples of d*d and of d (GPT-2 order: ln_1 w/b, c_attn w/b, c_proj w/b, ln_2 w/b,
    # c_fc w/b, mlp c_proj w/b)
    roles = [(0, 1), (0, 1), (3, 0), (0, 3), (1, 0), (0, 1), (0, 1), (0, 1), (4, 0), (0, 4), (4, 0), (0, 1)]
    layer_tensors = max(tensors - 2, 0)
    a = sum(roles[k % 12][0] for k in range(layer_tensors))
    b = sum(roles[k % 12][1] for k in range(layer_tensors))
    budget = total - (total + 7) // 8

    def layers_size(d: int) -> int:
        return a * d * d + b * d

    d = 0
    if a > 0:
        d = int((math.sqrt(float(b) * b + 4.0 * a * budget) - b) / (2.0 * a))
    elif b > 0:
        d = budget // b
    while d > 0 and layers_size(d) > budget:
        d -= 1
    while (a > 0 or b > 0) and layers_size(d + 1) <= budget:
        d += 1
    embedding = total - layers_size(d)
    sizes = [total if tensors == 1 else embedding // 2]
    sizes += [roles[k % 12][0] * d * d + roles[k % 12][1] * d for k in range(layer_tensors)]
    if tensors > 1:
        sizes.append(embedding - embedding // 2)
    return sizes


def parse_shape(text: str) -> Tuple[int, int, int, int]:
    """BATCHxHEADSxSEQxHEAD_DIM."""
    parts = text.split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"attention shape {text!r} is not BATCHxHEADSxSEQxHEAD_DIM")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def graph_spec(name: str) -> Tuple[str, int]:
    """laplacian::parse_graph: ('ring' | 'random', k 4..8), ('grid2d', 4) or ('grid3d', 6)."""
    if name == "grid2d":
        return "grid2d", 4
    if name == "grid3d":
        return "grid3d", 6
    m = re.fullmatch(r"(ring|random)([4-8])", name)
    if not m:
        raise UsageError(f"unknown graph {name!r} (ring4..ring8, random4..random8, grid2d, grid3d)")
    return m.group(1), int(m.group(2))


def _round_half_away(x: float) -> int:
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def grid_width(family: str, n: int) -> int:
    """nx of a grid: round(sqrt(n)) (2D) or round(cbrt(n)) (3D), halves away from zero, at least 1."""
    cbrt = getattr(math, "cbrt", lambda v: v ** (1.0 / 3.0))   # math.cbrt: Python 3.11
    return max(1, _round_half_away(math.sqrt(n) if family == "grid2d" else cbrt(n)))


def collate_fields(problem: Dict[str, str]) -> List[Tuple[str, int, str]]:
    """(name, elements per sample, dtype) per field, in batch order (collate::Shape::fields)."""
    seq = int(problem["seq_len"])
    fields = []
    if problem["layout"] == "text_pair":
        embed = int(problem["embed_dim"])
        fields += [("input_embedding", embed, "float32"), ("target_embedding", embed, "float32")]
    return fields + [("tokens", seq, "int64")]


M64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def uniform_at(seed: int, i: int, lo: float = -1.0, hi: float = 1.0) -> float:
    """Uniform in [lo, hi) from 24 random bits, rounded to fp32 as the C++ computes it."""
    bits = splitmix64((seed * 0x632BE59BD9B4E019 + i) & M64) >> 40
    return struct.unpack("f", struct.pack("f", lo + (hi - lo) * bits / 16777216.0))[0]


def splitmix64_np(x):
    import numpy as np
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def fisher_yates(n: int, draws) -> List[int]:
    """0..n-1 shuffled from the top: slot j swaps with draws[j] % (j + 1), j = n-1 .. 1."""
    order = list(range(n))
    picks = [0] * n
    if n > 1:
        import numpy as np
        j = np.arange(n, dtype=np.uint64)
        picks = (draws % (j + np.uint64(1))).tolist()
    for j in range(n - 1, 0, -1):
        k = picks[j]
        order[j], order[k] = order[k], order[j]
    return order


def epoch_order(samples: int, shuffled: bool) -> List[int]:
    """collate::epoch_order: the epoch's sample order (its seed collate.shuffle_seed)."""
    if not shuffled or samples < 2:
        return list(range(samples))
    seed = int(constant("collate.shuffle_seed"))
    import numpy as np
    j = np.arange(samples, dtype=np.uint64)
    return fisher_yates(samples, splitmix64_np(np.uint64((seed * 0x9E3779B97F4A7C15) & M64) + j))


def graph_permutation(n: int, seed: int, stream: int) -> List[int]:
    """laplacian.cpp's permutation(n, seed, stream): one random Hamiltonian cycle's node order."""
    import numpy as np
    j = np.arange(n, dtype=np.uint64)
    base = np.uint64(((seed * 0x9E3779B97F4A7C15) & M64) ^ ((stream << 40) & M64))
    return fisher_yates(n, splitmix64_np(base ^ j))


def laplacian_csr(graph: str, n: int, alpha: Optional[float] = None):
    """laplacian::build_shifted_laplacian: A = I + alpha L in CSR (int32 row_ptr and columns, fp64 values),
    columns sorted within a row, the diagonal among them: the stages' matrix, element for element (numpy)."""
    import numpy as np
    family, k = graph_spec(graph)
    alpha = float(constant("laplacian.alpha")) if alpha is None else alpha
    seed = int(constant("laplacian.graph_seed"))
    if not 1 <= n <= 2**31 - 1:
        raise UsageError(f"a graph needs 1 to 2^31 - 1 nodes, not {n}")
    index = np.int32 if 2 * n < 2**31 else np.int64   # every sum below stays under 2n
    i = np.arange(n, dtype=index)
    cand = []   # neighbour candidates per node, -1 where there is none
    if family == "ring":
        for d in range(1, k // 2 + 1):
            cand += [(i + d) % n, (i + (n - d % n)) % n]
        m = n // 2
        if k % 2 and m > 0:
            cand.append(np.where(i < m, i + m, np.where(i < 2 * m, i - m, -1)))
    elif family == "random":
        cycles = k // 2
        for c in range(cycles + k % 2):
            order = np.asarray(graph_permutation(n, seed, c), dtype=index)
            pos = np.empty(n, dtype=index)
            pos[order] = i
            if c < cycles:
                cand += [order[(pos + 1) % n], order[(pos + (n - 1)) % n]]
            else:   # odd k: a perfect matching of consecutive positions
                partner = pos ^ 1
                cand.append(np.where(partner < n, order[np.minimum(partner, n - 1)], -1))
    else:
        nx = grid_width(family, n)
        x = i % nx
        cand += [np.where(x > 0, i - 1, -1), np.where((x < nx - 1) & (i + 1 < n), i + 1, -1)]
        if family == "grid2d":
            cand += [np.where(i >= nx, i - nx, -1), np.where(i < n - nx, i + nx, -1)]
        else:
            ny, plane = nx, nx * nx
            y = (i // nx) % ny
            cand += [np.where(y > 0, i - nx, -1), np.where((y < ny - 1) & (i < n - nx), i + nx, -1),
                     np.where(i >= plane, i - plane, -1), np.where(i < n - plane, i + plane, -1)]
    cols = np.stack(cand + [i], axis=1).astype(index, copy=False)   # the diagonal last, sorted in below
    diagonal = cols == i[:, None]
    diagonal[:, -1] = False
    cols[(cols < 0) | diagonal] = n                           # absent and self links sort to the end
    cols.sort(axis=1)
    repeat = np.zeros(cols.shape, dtype=bool)
    repeat[:, 1:] = cols[:, 1:] == cols[:, :-1]
    cols[repeat] = n                                          # a neighbour reached twice is one link
    cols.sort(axis=1)
    keep = cols < n
    counts = keep.sum(axis=1)
    row_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=row_ptr[1:])
    if row_ptr[-1] > 2**31 - 1:
        raise UsageError(f"{graph} with {n} rows has more than 2^31 - 1 nonzeros")
    diagonal_value = 1.0 + alpha * (counts - 1).astype(np.float64)
    val = np.where(cols == i[:, None], diagonal_value[:, None], -alpha)[keep]
    col = cols[keep]
    return row_ptr.astype(np.int32), col.astype(np.int32), val


def uniform_array(seed: int, count: int, lo: float = -1.0, hi: float = 1.0):
    """uniform_at(seed, i) for i = 0..count-1 as a float32 numpy array (for [-1, 1) the float arithmetic of
    the C++ is exact: lo + 2 * bits / 2^24 needs no rounding)."""
    import numpy as np
    base = np.uint64((seed * 0x632BE59BD9B4E019) & M64)
    bits = (splitmix64_np(base + np.arange(count, dtype=np.uint64)) >> np.uint64(40)).astype(np.float64)
    return (lo + (hi - lo) * bits / 16777216.0).astype(np.float32)


def cg_rhs_sequence(n: int, drift: float, steps: Optional[int] = None):
    """cg::RhsSequence: b_0 .. b_steps as a (steps + 1) x n float64 array, and each step's drawn drift. b_0 is
    uniform_at(cg.seed_rhs, i); step t moves b_{t-1} by drift x (0.5 + (j + 1/2) / steps) of its norm (j a
    seeded permutation of 0..steps-1) along the direction uniform_at(cg.seed_rhs + 1000 + t, i)."""
    import numpy as np
    steps = int(constant("cg.window")) if steps is None else steps
    seed = int(constant("cg.seed_rhs"))
    order = list(range(steps))
    for j in range(steps - 1, 0, -1):
        k = splitmix64((seed * 0x9E3779B97F4A7C15 + j) & M64) % (j + 1)
        order[j], order[k] = order[k], order[j]
    b = np.empty((steps + 1, n), dtype=np.float64)
    b[0] = uniform_array(seed, n)
    drifts = [0.0] * (steps + 1)
    for t in range(1, steps + 1):
        drifts[t] = drift * (0.5 + (order[t - 1] + 0.5) / steps)
        direction = uniform_array(seed + 1000 + t, n).astype(np.float64)
        u = float(np.sqrt(np.dot(direction, direction)))
        scale = drifts[t] * float(np.sqrt(np.dot(b[t - 1], b[t - 1]))) / u if u > 0 else 0.0
        b[t] = b[t - 1] + scale * direction
    return b, drifts


def hostsync_predictions(steps: int, elements: int):
    """prediction(step, i) for steps 0..steps-1: a steps x elements float32 array
    (uniform_at(hostsync.seed_prediction, step x elements + i))."""
    return uniform_array(int(constant("hostsync.seed_prediction")), steps * elements).reshape(steps, elements)


def hostsync_metric_sums(steps: int, elements: int) -> List[float]:
    """hostsync::metric_sums: the loss (mean squared error), mean |error| and mean prediction^2 of steps
    0..steps-1 summed, in fp64."""
    import numpy as np
    p = hostsync_predictions(steps, elements).astype(np.float64)
    e = p - uniform_array(int(constant("hostsync.seed_target")), elements).astype(np.float64)[None, :]
    return [float((e * e).mean(axis=1).sum()), float(np.abs(e).mean(axis=1).sum()), float((p * p).mean(axis=1).sum())]


def launch_window(steps: int, kernels_per_step: int) -> List[Tuple[int, int, float]]:
    """The launch stage's window (launch_reference.cpp build_window) as (dst, src, weight) of one lerp_
    each: dst = (1 - w) dst + w src, w = 1 - a with the stage's coefficient a in [0.5, 0.75). One kernel
    per node, like the stage's dst = a dst + b src + c, and a convex combination, so the state stays bounded."""
    buffers, seed = int(constant("launch.state_buffers")), int(constant("launch.seed_coefficients"))
    window = []
    for s in range(steps):
        for k in range(kernels_per_step):
            dst = k % buffers
            src = (dst + 1 + s % (buffers - 1)) % buffers
            a = uniform_at(seed, 3 * (s * kernels_per_step + k), 0.5, 0.75)
            window.append((dst, src, 1.0 - a))
    return window


def alloc_probe_value(step: int, buffer: int) -> int:
    """The word a step writes into a buffer's probes (any value a wrong buffer would not hold)."""
    return (step * 1009 + buffer * 17 + 1) % 1000003
