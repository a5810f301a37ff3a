"""``python -m examples.partition`` (``make partition-test``): workers on separate hosts
(network namespaces, needs root), four network partitions under load; prints one JSON line and
exits 1 if a record was lost, handed out twice at one delivery count, or a scenario did not
heal."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from examples.partition.run import PartitionConfig, run
from queueflow.devtools.netns import available


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.partition", description=__doc__)
    parser.add_argument("--records", type=int, default=PartitionConfig.records)
    parser.add_argument("--rate", type=int, default=PartitionConfig.rate, help="records/s")
    parser.add_argument("--run-dir", type=Path, default=None, help="default: a temporary dir")
    args = parser.parse_args(argv)
    why = available()
    if why is not None:
        print(f"partition-test: {why}; run it as root on Linux", file=sys.stderr)
        return 2
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="queueflow-partition-"))
    config = PartitionConfig(records=args.records, rate=args.rate)
    result = run(config, run_dir, progress=lambda line: print(line, file=sys.stderr, flush=True))
    result["run_dir"] = str(run_dir)
    print(json.dumps(result, separators=(",", ":")), flush=True)
    one_way = [s for s in result["scenarios"] if s["name"] == "one_way"]
    ok = (
        result["lost"] == 0
        and result["repeated_delivery_counts"] == 0
        and "load_error" not in result
        and all(s.get("heal_s") is not None for s in result["scenarios"])
        and all((s.get("lapsed_before_successor_s") or 0) > 0 for s in one_way)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
