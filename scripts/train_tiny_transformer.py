"""Trains, quantizes and exports the int8 model shipped in `shapeml/apps/int8_sort/tiny_transformer.json`.

    python scripts/train_tiny_transformer.py            # rewrites the shipped files
    python scripts/train_tiny_transformer.py --out m.json --steps 3000

Same as `shapeml int8 train`. With the default arguments the run reproduces the shipped files
(seeded data, initialisation and batches; CPU, one process). It takes well under a minute on two
CPU cores.
"""

import sys

from shapeml.apps.int8_sort.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
