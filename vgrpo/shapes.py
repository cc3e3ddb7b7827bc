"""The shape-counting dataset: render, verify, assemble, write.

Every image is white with red triangles, blue circles and green squares (colours from params).
Shapes are placed in boxes that keep `min_gap` pixels from each other and from the border, so they
never overlap or touch; shapes shrink when an image is crowded. The `grid` layout (the CPU
profile's simplification) centres each shape in its own 32 px cell instead. Every label is then re-derived by an
independent counter (8-connected regions per fill colour) and an image whose count differs is an
error, never a wrong label. The same params give the same bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from scipy import ndimage

from vgrpo.config import COLOURS, GRID_CELL, SHAPES, SPLITS, WARMUP, GenerateParams, VgrpoError
from vgrpo.files import atomic_dir
from vgrpo.prompts import conversation, question_for

_EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)
_PLACEMENT_TRIES = 200  # random positions tried per shape before shrinking the shapes
_SHRINK = 0.85


class LayoutError(VgrpoError):
    """The requested shapes cannot be placed without touching."""


class LabelError(VgrpoError):
    """The independent counter disagrees with a label."""


@dataclasses.dataclass(frozen=True)
class Sample:
    image_png: bytes
    counts: dict[str, int]
    target_shape: str


def place_boxes(counts: dict[str, int], params: GenerateParams, rng: np.random.Generator):
    """Square boxes (shape, x, y, side) inside the canvas, at least `min_gap` apart.

    Sizes start in [min_shape_size, max_shape_size] and shrink when a layout does not fit.
    """
    order = [shape for shape in SHAPES for _ in range(counts[shape])]
    if params.layout == "grid":
        return place_on_grid(order, params, rng)
    largest = params.max_shape_size
    while largest >= params.min_shape_size:
        sides = rng.integers(params.min_shape_size, largest + 1, size=len(order))
        boxes = _try_place(order, sides, params, rng)
        if boxes is not None:
            return boxes
        largest = int(largest * _SHRINK) if largest > params.min_shape_size else params.min_shape_size - 1
    raise LayoutError(
        f"cannot place {dict(counts)} shapes of >= {params.min_shape_size}px with {params.min_gap}px gaps in a "
        f"{params.image_size}px image: lower generate.min_shape_size or the counts"
    )


def place_on_grid(order: list[str], params: GenerateParams, rng: np.random.Generator):
    """Each shape centred in its own cell of the 32 px grid that Qwen3-VL's merged image tokens cover, in
    random distinct cells: one image token sees one whole shape or none."""
    side = params.image_size // GRID_CELL
    cells = rng.choice(side * side, size=len(order), replace=False)
    sizes = rng.integers(params.min_shape_size, params.max_shape_size + 1, size=len(order))
    boxes = []
    for shape, cell, size in zip(order, cells, sizes, strict=True):
        row, column = divmod(int(cell), side)
        margin = (GRID_CELL - int(size)) // 2
        boxes.append((shape, column * GRID_CELL + margin, row * GRID_CELL + margin, int(size)))
    return boxes


def _try_place(order, sides, params: GenerateParams, rng: np.random.Generator):
    gap, size = params.min_gap, params.image_size
    placed: list[tuple[str, int, int, int]] = []
    for index in np.argsort(-sides, kind="stable"):  # biggest first: they are the hardest to fit
        side = int(sides[index])
        xs = rng.integers(gap, size - gap - side + 1, size=_PLACEMENT_TRIES)
        ys = rng.integers(gap, size - gap - side + 1, size=_PLACEMENT_TRIES)
        if placed:
            p = np.array([b[1:] for b in placed])  # x, y, side
            # Free when separated by >= gap along x or along y from every placed box.
            apart_x = (xs[:, None] + side + gap <= p[:, 0]) | (p[:, 0] + p[:, 2] + gap <= xs[:, None])
            apart_y = (ys[:, None] + side + gap <= p[:, 1]) | (p[:, 1] + p[:, 2] + gap <= ys[:, None])
            free = np.flatnonzero((apart_x | apart_y).all(axis=1))
            if free.size == 0:
                return None
            first = free[0]
        else:
            first = 0
        placed.append((order[index], int(xs[first]), int(ys[first]), side))
    return placed


def render(boxes, params: GenerateParams) -> Image.Image:
    """Draw each shape inside its box, without anti-aliasing, on a 4-colour palette image (white plus
    one colour per shape), so fill colours stay exact and PNG encoding is cheap."""
    colours = dataclasses.asdict(params.colours)
    image = Image.new("P", (params.image_size, params.image_size), 0)
    image.putpalette([255, 255, 255, *(c for shape in SHAPES for c in COLOURS[colours[shape]])])
    draw = ImageDraw.Draw(image)
    for shape, x, y, side in boxes:
        fill = SHAPES.index(shape) + 1
        x1, y1 = x + side - 1, y + side - 1
        if shape == "circles":
            draw.ellipse((x, y, x1, y1), fill=fill)
        elif shape == "squares":
            draw.rectangle((x, y, x1, y1), fill=fill)
        else:
            draw.polygon([(x + (side - 1) / 2, y), (x, y1), (x1, y1)], fill=fill)
    return image


def count_shapes(pixels: np.ndarray, params: GenerateParams) -> dict[str, int]:
    """Independent counter: 8-connected regions of each shape's fill colour."""
    colours = dataclasses.asdict(params.colours)
    red, green, blue = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    counts = {}
    for shape in SHAPES:
        r, g, b = COLOURS[colours[shape]]
        mask = (red == r) & (green == g) & (blue == b)
        counts[shape] = int(ndimage.label(mask, structure=_EIGHT_CONNECTED)[1])
    return counts


def make_sample(counts: dict[str, int], target_shape: str, params: GenerateParams,
                rng: np.random.Generator) -> Sample:
    buffer = io.BytesIO()
    render(place_boxes(counts, params, rng), params).save(buffer, format="PNG", compress_level=1)
    png = buffer.getvalue()
    # Count what will be stored: the PNG decoded back to RGB, as a model's processor will see it.
    seen = count_shapes(np.asarray(Image.open(io.BytesIO(png)).convert("RGB")), params)
    if seen != counts:
        raise LabelError(f"label check failed: rendered {counts}, counted {seen}")
    return Sample(png, dict(counts), target_shape)


def with_other_counts(shape: str, count: int, params: GenerateParams, rng: np.random.Generator,
                      other_max: int | None = None) -> dict[str, int]:
    """`count` of the asked shape, and a random count in the other shapes' range (up to `other_max`, by
    default generate.other_max_count) for each of the others; on the grid, drawn again until all fit."""
    other_max = params.other_max_count if other_max is None else other_max
    while True:
        counts = {s: int(rng.integers(params.other_min_count, other_max + 1)) for s in SHAPES}
        counts[shape] = count
        if params.layout != "grid" or sum(counts.values()) <= (params.image_size // GRID_CELL) ** 2:
            return counts


def other_max_count(split: str, params: GenerateParams) -> int:
    """The other shapes' largest count in a split: the warm-up split may describe more (warmup_other_max_count)."""
    if split == WARMUP and params.warmup_other_max_count is not None:
        return params.warmup_other_max_count
    return params.other_max_count


def split_plan(split: str, n: int, params: GenerateParams, rng: np.random.Generator):
    """(counts, target shape) per sample. Asked shape and its count cycle through every combination
    (shuffled each cycle), so questions are balanced across shapes and counts."""
    if split == "ood":
        asked_counts = range(params.ood_min_count, params.ood_max_count + 1)
    elif split == WARMUP and params.warmup_max_count is not None:
        asked_counts = range(params.min_count, params.warmup_max_count + 1)
    else:
        asked_counts = range(params.min_count, params.max_count + 1)
    combos = [(shape, count) for shape in SHAPES for count in asked_counts]
    plan = []
    while len(plan) < n:
        for i in rng.permutation(len(combos)):
            shape, count = combos[i]
            plan.append((with_other_counts(shape, count, params, rng, other_max_count(split, params)), shape))
    return plan[:n]


def split_sizes(params: GenerateParams) -> dict[str, int]:
    """Images per split, in the order they are drawn (a split's random stream depends on its place, so
    adding `warmup` last leaves the other splits' bytes as they were). A larger split can change the later
    splits' bytes: an image an earlier split holds is redrawn (`generate_samples`), which moves the later
    split's random stream on (on the cpu profile, `train_size: 1080` changes val, test and warmup; not OOD,
    whose counts no earlier split has)."""
    sizes = {split: getattr(params, f"{split}_size") for split in SPLITS}
    return {**sizes, WARMUP: params.warmup_size} if params.warmup_size else sizes


def generate_samples(params: GenerateParams, progress=None) -> dict[str, list[Sample]]:
    """All splits. No image appears twice, across or within splits (a repeat is redrawn; when the asked
    counts have no new image left, the other shapes' counts are drawn again)."""
    seen_images: set[bytes] = set()
    out: dict[str, list[Sample]] = {}
    for split_index, (split, n) in enumerate(split_sizes(params).items()):
        rng = np.random.default_rng([params.seed, split_index])
        samples = []
        for counts, shape in split_plan(split, n, params, rng):
            for attempt in range(1, 201):
                sample = make_sample(counts, shape, params, rng)
                digest = hashlib.sha256(sample.image_png).digest()
                if digest not in seen_images:
                    break
                if attempt % 50 == 0:  # every image of these counts is taken (a small grid has few): new other counts
                    counts = with_other_counts(shape, counts[shape], params, rng, other_max_count(split, params))
            else:
                raise LayoutError(f"{split}: could not draw a new image for {counts}")
            seen_images.add(digest)
            samples.append(sample)
            if progress is not None:
                progress.update(1)
        out[split] = samples
    return out


def to_dataset_dict(samples: dict[str, list[Sample]], params: GenerateParams):
    import datasets

    datasets.disable_progress_bars()
    features = datasets.Features({
        "id": datasets.Value("string"),
        "image": datasets.Image(),
        "question": datasets.Value("string"),
        "answer": datasets.Value("string"),
        "target_shape": datasets.Value("string"),
        "target_colour": datasets.Value("string"),
        "counts": {shape: datasets.Value("int32") for shape in SHAPES},
        "prompt": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
    })
    splits = {}
    for split, rows in samples.items():
        columns = {
            "id": [f"{split}-{i:05d}" for i in range(len(rows))],
            "image": [{"bytes": s.image_png, "path": None} for s in rows],
            "question": [question_for(s.target_shape) for s in rows],
            "answer": [str(s.counts[s.target_shape]) for s in rows],
            "target_shape": [s.target_shape for s in rows],
            "target_colour": [getattr(params.colours, s.target_shape) for s in rows],
            "counts": [s.counts for s in rows],
            "prompt": [conversation(question_for(s.target_shape)) for s in rows],
        }
        splits[split] = datasets.Dataset.from_dict(columns, features=features)
    return datasets.DatasetDict(splits)


def fingerprint(samples: dict[str, list[Sample]]) -> str:
    """sha256 over every image and label, in order: equal fingerprints mean equal datasets."""
    digest = hashlib.sha256()
    for split, rows in samples.items():
        for s in rows:
            digest.update(split.encode())
            digest.update(hashlib.sha256(s.image_png).digest())
            digest.update(json.dumps([s.target_shape, s.counts], sort_keys=True).encode())
    return digest.hexdigest()


def stats(samples: dict[str, list[Sample]], params: GenerateParams) -> dict:
    per_split = {}
    for split, rows in samples.items():
        answers = Counter(s.counts[s.target_shape] for s in rows)
        per_split[split] = {
            "size": len(rows),
            "answers": {str(k): answers[k] for k in sorted(answers)},
            "target_shapes": dict(sorted(Counter(s.target_shape for s in rows).items())),
        }
    total = sum(len(rows) for rows in samples.values())
    return {"splits": per_split, "images": total, "labels_verified": total, "label_errors": 0,
            "fingerprint": fingerprint(samples), "params": dataclasses.asdict(params)}


def preview(samples: dict[str, list[Sample]], params: GenerateParams, n: int = 16) -> Image.Image:
    """A labelled 4x4 grid: the first samples of each split, in turn."""
    picks = []
    splits = list(samples)
    i = 0
    while len(picks) < n and any(i < len(samples[s]) for s in splits):
        picks += [(s, samples[s][i]) for s in splits if i < len(samples[s])]
        i += 1
    picks = picks[:n]
    cell, label = params.image_size, 28
    cols = 4
    rows = (len(picks) + cols - 1) // cols
    grid = Image.new("RGB", (cols * cell, rows * (cell + label)), "white")
    draw = ImageDraw.Draw(grid)
    for k, (split, s) in enumerate(picks):
        x, y = (k % cols) * cell, (k // cols) * (cell + label)
        grid.paste(Image.open(io.BytesIO(s.image_png)), (x, y + label))
        c = s.counts
        draw.text((x + 4, y + 2), f"{split}: {s.target_shape}? {c[s.target_shape]}", fill="black")
        draw.text((x + 4, y + 14), f"tri {c['triangles']}  circ {c['circles']}  sq {c['squares']}", fill="gray")
        draw.rectangle((x, y, x + cell - 1, y + cell + label - 1), outline="lightgray")
    return grid


def write_dataset(samples: dict[str, list[Sample]], params: GenerateParams, out_dir: str | Path) -> dict:
    """Save the DatasetDict, stats.json and preview.png into a temp dir next to `out_dir`, then swap it
    in with a rename, so an interrupted run never leaves half a dataset."""
    summary = stats(samples, params)
    with atomic_dir(out_dir) as tmp:
        to_dataset_dict(samples, params).save_to_disk(str(tmp))
        _pin_fingerprints(tmp, summary["fingerprint"])
        (tmp / "stats.json").write_text(json.dumps(summary, indent=2) + "\n")
        preview(samples, params).save(tmp / "preview.png", optimize=False)
    return summary


def _pin_fingerprints(dataset_dir: Path, content_fingerprint: str) -> None:
    """`datasets` writes a random fingerprint into state.json; replace it with one derived from the
    content, so the same params give the same bytes."""
    for state in sorted(dataset_dir.glob("*/state.json")):
        data = json.loads(state.read_text())
        data["_fingerprint"] = hashlib.sha256(f"{content_fingerprint}/{state.parent.name}".encode()).hexdigest()[:16]
        state.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_dataset(path: str | Path, splits=SPLITS):
    """Load `data/shapes`, with a one-line error when it is missing or not a dataset."""
    import datasets

    path = Path(path)
    if not (path / "dataset_dict.json").is_file():
        raise VgrpoError(f"{path}: no dataset here (run the generate stage: dvc repro generate)")
    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001 - any failure to read is the same message to the user
        raise VgrpoError(f"{path}: cannot read the dataset ({type(err).__name__}: {err})") from None
    missing = [s for s in splits if s not in dataset]
    if missing:
        raise VgrpoError(f"{path}: no split {missing[0]!r} (the dataset has {', '.join(dataset)})")
    required = {"image", "question", "answer", "target_shape", "prompt"}
    for split in splits:
        lacking = required - set(dataset[split].column_names)
        if lacking:
            raise VgrpoError(f"{path}: split {split!r} lacks column {sorted(lacking)[0]!r}")
    return dataset


def dataset_colours(path: str | Path) -> dict[str, str]:
    """Each shape's colour in the dataset at `path`, as generated (its stats.json)."""
    stats = json.loads((Path(path) / "stats.json").read_text())
    return {shape: stats["params"]["colours"][shape] for shape in SHAPES}
