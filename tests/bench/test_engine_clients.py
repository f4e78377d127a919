"""bench/engine_clients.py runs end to end, small, against the real redis-server and
nats-server it starts: the figures that chose the cluster engine's client library can be
measured again. The minimal Twisted NATS client needs only Twisted, so it always runs; the
library variants run where the ``bench`` extra is installed, and are skipped by name where
it is not."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench"
VARIANTS = ("hiredis", "txredisapi", "redispy", "natspy", "twisted-nats")


def test_every_variant_measures_or_is_skipped_by_name():
    done = subprocess.run(
        [sys.executable, str(BENCH / "engine_clients.py"), "--count", "3000", "--repeat", "1",
         "--quiet-wait", "0", "--no-pin", "--variants", ",".join(VARIANTS)],
        capture_output=True, text=True, timeout=240, cwd=BENCH.parent, check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "3,000 messages of 64-200 B, batches of 100, window 1" in out
    rows = {}
    for line in out.splitlines():
        cells = line.split()
        if cells and cells[0] in VARIANTS:
            rows[cells[0]] = cells[1:]
    skipped = set(re.findall(r"^skipped (\S+): ", out, re.MULTILINE))
    assert "twisted-nats" in rows, out
    assert set(rows) | skipped == set(VARIANTS) and not set(rows) & skipped, out
    for variant, cells in rows.items():
        pub_rate, e2e_rate, pub_us, recv_us = cells[:4]
        assert float(pub_rate.replace(",", "")) > 0 and float(e2e_rate.replace(",", "")) > 0
        assert float(pub_us) > 0 and float(recv_us) > 0, variant
    assert re.search(r"^servers: .*nats-server: v\d", out, re.MULTILINE), out
