"""The dataset: verified labels, no touching shapes, balanced questions, disjoint splits, same bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
from collections import Counter

import numpy as np
import pytest
from conftest import load_params
from PIL import Image, ImageDraw

from vgrpo import shapes
from vgrpo.config import COLOURS, SHAPES, config_from_dict


def generate_params(**changes):
    return dataclasses.replace(config_from_dict(load_params()).generate, **changes)


def small(**changes):
    return generate_params(train_size=45, val_size=15, test_size=15, ood_size=18, **changes)


@pytest.fixture(scope="module")
def samples():
    return shapes.generate_samples(small())


def decode(sample) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(sample.image_png)).convert("RGB"))


def test_labels_match_an_independent_recount(samples):
    params = small()
    for rows in samples.values():
        for sample in rows:
            assert shapes.count_shapes(decode(sample), params) == sample.counts


def test_count_ranges_in_and_out_of_distribution(samples):
    for split, rows in samples.items():
        for s in rows:
            asked = s.counts[s.target_shape]
            others = [s.counts[k] for k in SHAPES if k != s.target_shape]
            assert all(1 <= c <= 5 for c in others)
            assert (6 <= asked <= 8) if split == "ood" else (1 <= asked <= 5)


def test_questions_balanced_across_shapes_and_counts(samples):
    train = Counter((s.target_shape, s.counts[s.target_shape]) for s in samples["train"])
    assert set(train) == set(itertools.product(SHAPES, range(1, 6)))
    assert set(train.values()) == {3}  # 45 = 3 x (3 shapes x 5 counts)
    ood = Counter((s.target_shape, s.counts[s.target_shape]) for s in samples["ood"])
    assert set(ood) == set(itertools.product(SHAPES, range(6, 9)))
    assert set(ood.values()) == {2}  # 18 = 2 x (3 shapes x 3 counts)


def test_boxes_inside_canvas_and_apart():
    params = generate_params()
    rng = np.random.default_rng(0)
    for _ in range(200):
        counts = {s: int(rng.integers(1, 9)) for s in SHAPES}
        boxes = shapes.place_boxes(counts, params, rng)
        assert Counter(b[0] for b in boxes) == Counter(counts)
        for _, x, y, side in boxes:
            assert params.min_gap <= x and x + side + params.min_gap <= params.image_size
            assert params.min_gap <= y and y + side + params.min_gap <= params.image_size
        for (_, x1, y1, s1), (_, x2, y2, s2) in itertools.combinations(boxes, 2):
            gap_x = max(x2 - (x1 + s1), x1 - (x2 + s2))
            gap_y = max(y2 - (y1 + s1), y1 - (y2 + s2))
            assert max(gap_x, gap_y) >= params.min_gap


def test_shapes_never_touch_in_pixels(samples):
    """Every coloured pixel's 8-neighbourhood holds only white or its own colour."""
    for sample in samples["ood"]:  # the most crowded split
        pixels = decode(sample).astype(np.int32)
        code = (pixels[..., 0] << 16) | (pixels[..., 1] << 8) | pixels[..., 2]
        padded = np.pad(code, 1, constant_values=0xFFFFFF)
        for dy, dx in itertools.product((-1, 0, 1), repeat=2):
            neighbour = padded[1 + dy:padded.shape[0] - 1 + dy, 1 + dx:padded.shape[1] - 1 + dx]
            clash = (code != 0xFFFFFF) & (neighbour != 0xFFFFFF) & (neighbour != code)
            assert not clash.any()
        assert (code[0] == 0xFFFFFF).all() and (code[-1] == 0xFFFFFF).all()  # nothing on the border


def test_crowded_images_shrink_shapes_instead_of_failing():
    params = generate_params(min_shape_size=8, max_shape_size=60)
    boxes = shapes.place_boxes({"triangles": 8, "circles": 8, "squares": 8}, params, np.random.default_rng(1))
    assert len(boxes) == 24
    assert max(b[3] for b in boxes) < 60


def test_impossible_layout_is_a_clear_error():
    params = generate_params(min_shape_size=60, max_shape_size=60)
    with pytest.raises(shapes.LayoutError, match=r"cannot place .* shapes of >= 60px"):
        shapes.place_boxes({"triangles": 8, "circles": 8, "squares": 8}, params, np.random.default_rng(0))


def test_counter_catches_touching_shapes():
    """The independent counter is not fooled by a renderer bug: two touching circles count as one."""
    params = generate_params()
    image = Image.new("RGB", (256, 256), "white")
    draw = ImageDraw.Draw(image)
    blue = COLOURS[params.colours.circles]
    draw.ellipse((10, 10, 49, 49), fill=blue)
    draw.ellipse((49, 10, 88, 49), fill=blue)
    draw.rectangle((120, 120, 140, 140), fill=COLOURS[params.colours.squares])
    assert shapes.count_shapes(np.asarray(image), params) == {"triangles": 0, "circles": 1, "squares": 1}


def test_wrong_label_is_refused(monkeypatch):
    """make_sample raises when what was drawn disagrees with the label."""
    params = small()
    real_place = shapes.place_boxes

    def drop_one(counts, p, rng):
        return real_place(counts, p, rng)[1:]

    monkeypatch.setattr(shapes, "place_boxes", drop_one)
    with pytest.raises(shapes.LabelError, match="label check failed"):
        shapes.make_sample({"triangles": 2, "circles": 2, "squares": 2}, "circles", params,
                           np.random.default_rng(0))


def test_no_image_in_two_splits(samples):
    digests = [hashlib.sha256(s.image_png).hexdigest() for rows in samples.values() for s in rows]
    assert len(digests) == len(set(digests))


def test_same_params_same_bytes_other_seed_other_bytes():
    first = shapes.generate_samples(small())
    again = shapes.generate_samples(small())
    other = shapes.generate_samples(small(seed=1))
    assert shapes.fingerprint(first) == shapes.fingerprint(again)
    assert [s.image_png for s in first["val"]] == [s.image_png for s in again["val"]]
    assert shapes.fingerprint(first) != shapes.fingerprint(other)


def test_colours_follow_params():
    params = small(colours=dataclasses.replace(small().colours, circles="purple", squares="orange"))
    sample = shapes.make_sample({"triangles": 1, "circles": 2, "squares": 3}, "circles", params,
                                np.random.default_rng(0))
    colours = {tuple(c) for c in decode(sample).reshape(-1, 3)}
    assert colours == {(255, 255, 255), COLOURS["red"], COLOURS["purple"], COLOURS["orange"]}


@pytest.mark.slow
def test_ten_thousand_images_zero_label_errors():
    """10,000 images, every label re-counted from the stored PNG bytes."""
    params = generate_params(train_size=7000, val_size=1000, test_size=1000, ood_size=1000, seed=11)
    samples = shapes.generate_samples(params)
    errors = sum(shapes.count_shapes(decode(s), params) != s.counts for rows in samples.values() for s in rows)
    assert sum(len(rows) for rows in samples.values()) == 10_000
    assert errors == 0


# --- The grid layout (the cpu profile) and the warm-up split -------------------------------------

def grid(**changes):
    return small(layout="grid", image_size=128, min_shape_size=24, max_shape_size=24, min_gap=2, other_min_count=0,
                 other_max_count=3, **changes)


def test_grid_puts_each_shape_alone_in_its_own_32px_cell():
    params = grid()
    for rows in shapes.generate_samples(params).values():
        for sample in rows[:10]:
            pixels = decode(sample)
            assert shapes.count_shapes(pixels, params) == sample.counts
            painted = (pixels != 255).any(axis=-1)
            for row, column in itertools.product(range(4), range(4)):
                cell = painted[row * 32:(row + 1) * 32, column * 32:(column + 1) * 32]
                assert not cell[:2].any() and not cell[-2:].any() and not cell[:, :2].any() and not cell[:, -2:].any()
            assert sum(painted[r * 32:(r + 1) * 32, c * 32:(c + 1) * 32].any()
                       for r, c in itertools.product(range(4), range(4))) == sum(sample.counts.values())


def test_other_shapes_have_their_own_count_range():
    for split, rows in shapes.generate_samples(grid()).items():
        for s in rows:
            assert all(0 <= s.counts[k] <= 3 for k in SHAPES if k != s.target_shape)
            assert (6 <= s.counts[s.target_shape] <= 8) if split == "ood" else (1 <= s.counts[s.target_shape] <= 5)


@pytest.mark.parametrize("changes, message", [
    ({"image_size": 120}, "generate.image_size: layout grid needs a multiple of 32 px"),
    ({"max_shape_size": 30}, "generate.max_shape_size: layout grid puts each shape in a 32 px cell"),
    ({"other_max_count": 5}, "generate.other_max_count: layout grid has 16 cells at 128 px, but an image may need 18"),
    ({"warmup_max_count": 17, "other_min_count": 0},
     "generate.other_min_count: layout grid has 16 cells at 128 px, but a warm-up image needs at least 17"),
])
def test_grid_limits_are_params_errors(changes, message):
    from vgrpo.config import ConfigError

    raw = load_params()
    raw["generate"].update(layout="grid", image_size=128, min_shape_size=24, max_shape_size=24, min_gap=2,
                           other_min_count=0, other_max_count=3, min_count=1, max_count=5)
    raw["generate"].update(changes)
    with pytest.raises(ConfigError, match=f"^params.yaml: {message}"):
        config_from_dict(raw)


def test_warmup_split_is_disjoint_and_leaves_the_other_splits_as_they_were():
    without = shapes.generate_samples(small())
    with_warmup = shapes.generate_samples(small(warmup_size=30))
    assert list(with_warmup) == ["train", "val", "test", "ood", "warmup"] and len(with_warmup["warmup"]) == 30
    for split in without:  # adding the warm-up split changes no byte of the others
        assert [s.image_png for s in without[split]] == [s.image_png for s in with_warmup[split]]
    others = {s.image_png for split in without for s in with_warmup[split]}
    assert not others & {s.image_png for s in with_warmup["warmup"]}
    assert all(1 <= s.counts[s.target_shape] <= 5 for s in with_warmup["warmup"])


def test_warmup_max_count_puts_counts_above_the_training_range_in_the_warmup_split_only():
    """`generate.warmup_max_count: 8` (the warm start sees the asked shape up to 8 times, as a pretrained
    model has): every count 1-8 in the warm-up split, no other split's bytes changed, and no warm-up image is
    an OOD one."""
    without = shapes.generate_samples(grid(warmup_size=48))
    wider = shapes.generate_samples(grid(warmup_size=48, warmup_max_count=8))
    for split in ("train", "val", "test", "ood"):
        assert [s.image_png for s in without[split]] == [s.image_png for s in wider[split]]
    asked = Counter(s.counts[s.target_shape] for s in wider["warmup"])
    assert set(asked) == set(range(1, 9)) and min(asked.values()) >= 48 // 8 - 1  # balanced over 1-8
    assert max(s.counts[s.target_shape] for s in without["warmup"]) == 5
    assert not {s.image_png for s in wider["ood"]} & {s.image_png for s in wider["warmup"]}
    for s in wider["warmup"]:
        assert shapes.count_shapes(decode(s), grid()) == s.counts


def test_a_larger_train_split_redraws_val_and_test_but_not_ood():
    """No image appears twice across splits: a val or test image that train already holds is redrawn, which
    moves that split's random stream on, so `train_size` changes their bytes (split_sizes says so; the cpu
    profile's val, test and warmup changed at 1080). OOD's asked counts are never in train: its bytes stay."""
    sizes = {"val_size": 256, "test_size": 200, "ood_size": 120}
    before = shapes.generate_samples(dataclasses.replace(grid(), train_size=600, **sizes))
    after = shapes.generate_samples(dataclasses.replace(grid(), train_size=1080, **sizes))
    changed = {split for split in before if [s.image_png for s in before[split]] != [s.image_png for s in after[split]]}
    assert changed == {"train", "val", "test"}

def test_a_small_grid_with_few_distinct_images_still_fills_every_split():
    """An image of one square has 16 distinct renderings on a 4x4 grid: when they are used up, the other
    shapes' counts are drawn again (the asked shape and its count stay) rather than failing. The cpu
    profile's 4,184 images need this."""
    params = dataclasses.replace(grid(min_count=1, max_count=1, warmup_size=300), other_max_count=1)
    samples = shapes.generate_samples(params)
    images = [s.image_png for rows in samples.values() for s in rows]
    assert len(images) == len(set(images)) == 45 + 15 + 15 + 18 + 300
    for split, rows in samples.items():
        if split != "ood":
            assert all(s.counts[s.target_shape] == 1 for s in rows)
        assert Counter(s.target_shape for s in rows).most_common()[-1][1] >= len(rows) // 3 - 1  # still balanced
