"""What hpp prints agrees in number ("1 pipeline", never "1 pipelines" or "rank(s)") and never shows a missing
baseline as "inf s (nanx)"."""

from __future__ import annotations

import math
import re

from hpp.bench.evaluation import ScenarioRow, scenario_line
from hpp.cli import main
from hpp.wording import count

ONE_PLURAL = re.compile(r"(?<![\d.,])1 (pipelines|devices|samples|ranks|steps|candidates|blocks|parameters|copies)\b")


def test_count_agrees_with_its_number():
    assert [count(n, "pipeline") for n in (0, 1, 2)] == ["0 pipelines", "1 pipeline", "2 pipelines"]
    assert count(1, "copy", "copies") == "1 copy" and count(3, "copy", "copies") == "3 copies"


def test_a_one_pipeline_plan_reads_in_the_singular(tmp_path, capsys):
    out = tmp_path / "one.json"
    assert main(["plan", "--scenario", "cpu-hetero-4", "--gbs", "1", "--no-baselines", "--quiet",
                 "--out", str(out)]) == 0
    planned = capsys.readouterr().out
    assert main(["estimate", str(out)]) == 0
    estimated = capsys.readouterr().out
    assert f"plan {out}: gpt-tiny, 1 pipeline on 2 devices" in estimated              # was "1 pipelines"
    assert "1 pipeline: 1 sample, " in estimated and "1 pipeline in 1 distinct kind" in estimated
    for text in (planned, estimated):
        assert not ONE_PLURAL.search(text), ONE_PLURAL.search(text).group(0)
        assert "(s)" not in text


def test_a_baseline_without_a_plan_is_none_found_not_inf():
    r = ScenarioRow("x", "m", 40, 6.0, 6.0, 18.0, math.inf, 3.0, math.nan, 0.4, 0.0, 0.08, "FEASIBLE", 5, 0, 6.0, "")
    line = scenario_line(r)
    assert "single-shape none found" in line and "uniform 18.000 s (3.00x)" in line
    assert "inf" not in line and "nan" not in line
