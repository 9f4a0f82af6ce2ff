"""The README's first command: the demo runs on embedded SQLite and says OK."""

import ast
import re
import subprocess
import sys


def test_demo_runs_on_sqlite(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sqlqueue_orm.demo", "--dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo OK" in result.stdout
    # The last line says what each figure is: billing's count is the one after the rollback.
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("demo OK: billing held 1 message after the rolled-back order;"), last
    assert "300 handled by 3 consumers, 0 duplicates" in last, last
    assert "handled 300 distinct messages, 0 duplicates" in result.stdout
    # The three consumers compete for the queue: each takes a share of it.
    shares = ast.literal_eval(re.search(r"per consumer: (\{.*\})", result.stdout).group(1))
    assert sorted(shares) == ["consumer-0", "consumer-1", "consumer-2"], shares
    assert sum(shares.values()) == 300 and all(count > 0 for count in shares.values()), shares
    assert "CREATE CLUSTERED INDEX [Index_RowVersion] ON [dbo].[billing]" in result.stdout
    assert (tmp_path / "out" / "demo.db").exists()
