"""The shapes data set and the batching iterator."""

import numpy as np
import pytest

from shapeml.data import batches, shapes


def test_draw_shapes_dtypes_and_determinism():
    x, y = shapes.draw(64, seed=5)
    assert x.shape == (64, 1, 16, 16) and x.dtype == np.uint8
    assert y.shape == (64,) and y.dtype == np.int32 and set(y) == {0, 1, 2, 3}
    x2, y2 = shapes.draw(64, seed=5)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert not np.array_equal(shapes.draw(64, seed=6)[0], x)


def test_classes_balanced_and_images_have_ink():
    x, y = shapes.draw(1001, seed=0)
    counts = np.bincount(y, minlength=4)
    assert counts.max() - counts.min() <= 1
    bright = (x > 120).reshape(len(x), -1).sum(axis=1)
    assert bright.min() >= 5  # every image shows its shape


def test_shape_classes_differ_in_ink_area():
    x, y = shapes.draw(2000, seed=1)
    area = (x > 120).reshape(len(x), -1).sum(axis=1)
    mean_area = [area[y == c].mean() for c in range(4)]
    assert mean_area[0] > mean_area[1] > max(mean_area[2], mean_area[3])  # square > disk > strokes


def test_batches_shuffle_per_epoch_and_cover_everything():
    a = np.arange(10)
    b = a * 10
    got = list(batches(a, b, batch_size=5, seed=3, epochs=2))
    assert len(got) == 4
    for xa, xb in got:
        np.testing.assert_array_equal(xb, xa * 10)
    epoch0 = np.concatenate([g[0] for g in got[:2]])
    epoch1 = np.concatenate([g[0] for g in got[2:]])
    assert sorted(epoch0) == list(range(10)) and not np.array_equal(epoch0, epoch1)
    again = list(batches(a, b, batch_size=5, seed=3, epochs=2))
    np.testing.assert_array_equal(got[3][0], again[3][0])


def test_batches_drop_last_and_errors():
    assert [len(x) for (x,) in batches(np.arange(7), batch_size=3, epochs=1)] == [3, 3]
    assert [len(x) for (x,) in batches(np.arange(7), batch_size=3, epochs=1, drop_last=False)] == [
        3,
        3,
        1,
    ]
    with pytest.raises(ValueError, match="differ in length"):
        next(batches(np.arange(3), np.arange(4), batch_size=2))
    with pytest.raises(ValueError, match="batch_size"):
        next(batches(np.arange(3), batch_size=4))
