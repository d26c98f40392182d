"""``python -m bench``: every benchmark table (see bench/run_all.py)."""

from bench.run_all import main

raise SystemExit(main())
