#!/usr/bin/env python3
"""What a work dir filesystem (agent/diskfs.py) adds to a job's start and end: the
median over --starts of making a sparse image of --size-mb, mkfs.ext4, mounting it
(DiskFs.create) and unmounting it and deleting the image (DiskFs.release), in a
temporary directory under --dir (the filesystem the agent's state dir is on). Root,
loop devices and mkfs.ext4 needed. Prints one JSON line."""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from corral.agent.diskfs import DiskFs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--size-mb", type=int, default=10240)
    parser.add_argument("--dir", default="./var")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-diskfs-", dir=args.dir) as where:
        fs = DiskFs(os.path.join(where, "disk"), os.path.join(where, "work"))
        made, total = [], []
        for n in range(args.starts):
            workdir = os.path.join(where, "work", f"job-{n}")
            os.makedirs(workdir)
            start = time.perf_counter()
            if not fs.create(workdir, args.size_mb):
                print("could not make a filesystem here (see the warning above)", file=sys.stderr)
                return 1
            mounted = time.perf_counter()
            fs.release(workdir)
            total.append(time.perf_counter() - start)
            made.append(mounted - start)
            os.rmdir(workdir)
    print(json.dumps({"scenario": "diskfs", "starts": args.starts, "size_mb": args.size_mb,
                      "create_median_ms": round(statistics.median(made) * 1000, 1),
                      "create_release_median_ms": round(statistics.median(total) * 1000, 1),
                      "max_ms": round(max(total) * 1000, 1), "load_average": os.getloadavg()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
