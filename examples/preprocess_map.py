"""The seed's "Preprocessing with TensorDict.map" example, runnable as a script.

A dataset of images and labels is allocated on disk with ``memmap_like`` (as in
the seed's "building datasets" section, at a smaller size), filled, then
preprocessed in place by worker processes: each worker receives one image at
a time (``chunksize=0``) and overwrites it, flipped, together with its label
divided by 10. The workers write straight into the memory-mapped files, so the
main process sees the result without any copy.

Run it with ``python examples/preprocess_map.py [--size N] [--workers W]``.
"""
import argparse
import tempfile

import torch
from torchdict import TensorDict, MemoryMappedTensor  # noqa: F401  (the seed imports both)


def process_data(data):
    images = data.get("images").flip(-2).clone()
    labels = data.get("labels") // 10
    # we update the td inplace
    data.set_("images", images)  # flip image
    data.set_("labels", labels)  # cluster labels


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1000, help="number of images (the seed uses 1000000)")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        # allocate memory of the dataset on disk
        data = TensorDict({
            "images": torch.zeros((128, 128, 3), dtype=torch.uint8),
            "labels": torch.zeros((), dtype=torch.int)}, batch_size=[])
        data = data.expand(args.size)
        data = data.memmap_like(folder)
        # ==> Fill your dataset here
        generator = torch.Generator().manual_seed(0)
        originals = torch.randint(0, 256, (args.size, 128, 128, 3), dtype=torch.uint8, generator=generator)
        original_labels = torch.randint(0, 1000, (args.size,), dtype=torch.int, generator=generator)
        data["images"].copy_(originals)
        data["labels"].copy_(original_labels)

        # create data_preproc here
        data_preproc = data.map(process_data, num_workers=args.workers, chunksize=0, pbar=True)  # process 1 images at a time

        assert data_preproc is None  # process_data returns None: the work happened in place
        assert (data["labels"] == original_labels // 10).all()
        assert (data["images"] == originals.flip(-2)).all()
        print(f"preprocessed {args.size} images in place with {args.workers} workers: "
              f"labels[:5] = {data['labels'][:5].tolist()}")
