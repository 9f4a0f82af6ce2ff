"""The README's first command: the demo runs on embedded SQLite and says OK."""

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
    assert "handled 300 distinct messages, 0 duplicates" in result.stdout
    assert "CREATE CLUSTERED INDEX [Index_RowVersion] ON [dbo].[billing]" in result.stdout
    assert (tmp_path / "out" / "demo.db").exists()
