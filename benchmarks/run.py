"""Run partir's benchmark suite: `python benchmarks/run.py [--quick] [--json] [--report FILE]`.

The same as `partir bench`; see benchmarks/README.md.
"""

import argparse
import sys

from partir.bench import DEFAULT_REPORT, main

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a subset that runs in a few minutes")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--report", default=DEFAULT_REPORT, help="markdown report to write")
    args = p.parse_args()
    sys.exit(main(quick=args.quick, as_json=args.json, report=args.report))
