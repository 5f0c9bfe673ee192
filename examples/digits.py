"""A small CNN of `shapeml.nn` layers on scikit-learn's handwritten digits (8x8, 1,797 images).

Conv-BatchNorm-ReLU twice, max pooling, dropout and a linear head, trained with AdamW (warmup +
cosine, clipping) on a fixed stratified 80/20 split; prints the test accuracy and saves the
confusion matrix as a plot. Nothing is downloaded: the digits ship with scikit-learn.

Run: python examples/digits.py [--epochs 40] [--out digits_confusion.png]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

import shapeml as sm
from shapeml import nn, optim
from shapeml.training import TrainStep


class DigitsCNN(sm.Model):
    """`[b 1 S S]` images -> `[b N]` logits; the layers take these dims by name."""

    dims = sm.Dims(S=8, C1=32, C2=64, H="C2 * (S // 2) ** 2", N=10)
    conv1: nn.Conv2d = sm.submodel(nn.Conv2d, Ci=1, Co="C1", padding=1)
    bn1: nn.BatchNorm = sm.submodel(nn.BatchNorm, C="C1")
    conv2: nn.Conv2d = sm.submodel(nn.Conv2d, Ci="C1", Co="C2", padding=1)
    bn2: nn.BatchNorm = sm.submodel(nn.BatchNorm, C="C2")
    pool: nn.MaxPool2d = sm.submodel(nn.MaxPool2d, window=2)
    drop: nn.Dropout = sm.submodel(nn.Dropout, rate=0.3)
    head: nn.Linear = sm.submodel(nn.Linear, In="H", Out="N")


@sm.shaped
def forward(
    m: DigitsCNN, x: Float[Array, "b 1 S S"], *, train: bool, key: PRNGKeyArray | None = None
) -> tuple[Float[Array, "b N"], DigitsCNN]:
    """Logits, and the model with BatchNorm's running statistics updated when `train`."""
    h, bn1 = m.bn1(m.conv1(x), train=train)
    h, bn2 = m.bn2(m.conv2(jax.nn.relu(h)), train=train)
    h = m.pool(jax.nn.relu(h))
    h = m.drop(h.reshape(h.shape[0], -1), key=key if train else None)
    return m.head(h), m.replace(bn1=bn1, bn2=bn2)


def loss(m: DigitsCNN, x, y: Int[Array, " b"], key):
    """The cross-entropy, and the model with BatchNorm's new running statistics: `TrainStep`
    carries that model's buffers, while the optimizer updates only the params."""
    logits, new = forward(m, x, train=True, key=key)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1)), new


@jax.jit
def predict(m: DigitsCNN, x) -> jax.Array:
    return jnp.argmax(forward(m, x, train=False)[0], axis=-1)


def load_split(seed: int = 0):
    """The digits scaled to [0, 1] as `[n 1 8 8]`, split 80/20, stratified, with a fixed seed."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int32)
    return train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)


def confusion(pred: np.ndarray, y: np.ndarray, classes: int = 10) -> np.ndarray:
    """`c[i, j]`: how many images of digit `i` were predicted as `j`."""
    c = np.zeros((classes, classes), np.int64)
    np.add.at(c, (y, pred), 1)
    return c


def plot_confusion(c: np.ndarray, accuracy: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # a file, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.imshow(c, cmap="Blues")
    for i, j in np.ndindex(c.shape):
        if c[i, j]:
            color = "white" if c[i, j] > c.max() / 2 else "black"
            ax.text(j, i, str(c[i, j]), ha="center", va="center", color=color, fontsize=8)
    ax.set(xticks=range(10), yticks=range(10), xlabel="predicted", ylabel="true digit")
    ax.set_title(f"digits CNN: test accuracy {accuracy:.2%}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="digits_confusion.png", help="the confusion matrix plot")
    args = p.parse_args(argv)
    start = time.perf_counter()
    x_train, x_test, y_train, y_test = load_split()
    steps_per_epoch = len(x_train) // args.batch_size
    steps = args.epochs * steps_per_epoch
    m = DigitsCNN.init(seed=args.seed)
    warm = max(1, steps // 20)
    schedule = optim.warmup(warm, optim.cosine(args.lr, max(1, steps - warm)))
    opt = optim.adamw(
        m, lr=schedule, weight_decay=1e-4, transforms=[optim.clip_norm(1.0)], skip_nonfinite=False
    )
    step = TrainStep(loss, m, opt, has_aux=True)  # one compiled step, its carry donated
    rng = np.random.default_rng(args.seed)
    key = jax.random.key(args.seed)
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        for i in range(steps_per_epoch):
            idx = order[i * args.batch_size : (i + 1) * args.batch_size]
            step_key = jax.random.fold_in(key, epoch * steps_per_epoch + i)
            value = step(x_train[idx], y_train[idx], step_key)
        if epoch % 10 == 9 or epoch == args.epochs - 1:
            print(f"epoch {epoch + 1:3d}: train loss {float(value):.4f}")
    m = step.model
    pred = np.asarray(predict(m, x_test))
    accuracy = float(np.mean(pred == y_test))
    c = confusion(pred, y_test)
    plot_confusion(c, accuracy, args.out)
    seconds = time.perf_counter() - start
    print(f"test accuracy: {accuracy:.2%} on {len(y_test)} held-out digits ({seconds:.0f} s)")
    print(f"confusion matrix saved to {args.out}")
    return {"accuracy": accuracy, "confusion": c, "model": m, "seconds": seconds}


if __name__ == "__main__":
    main()
