"""``python -m paged.bench fair_share`` on tiny sizes: a real server, a flood from 127.0.0.9, asks from
127.0.0.1 (under ``priority`` with priority -1); the JSON it promises (exact keys and counts; the times are only
checked to be times)."""

import json

from paged.bench.__main__ import main


def test_bench_fair_share_json_shape(capsys):
    code = main(["fair_share", "--policies", "fair", "priority", "--hog-requests", "16", "--hog-tokens", "64", "--interval", "0.2",
                 "--server-arg=--num-blocks", "--server-arg=32", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert set(result) == {"fair", "priority"}
    for figures in result.values():
        assert set(figures) == {"newcomer_asks", "newcomer_median_s", "newcomer_worst_s", "hog_s", "hog_tokens_per_s",
                                "hog_ok"}
        assert figures["hog_ok"] == 16 and figures["newcomer_asks"] >= 1
        assert 0 < figures["newcomer_median_s"] <= figures["newcomer_worst_s"] and figures["hog_tokens_per_s"] > 0
    assert [line[:20] for line in out.splitlines()[:2]] == ["fair      newcomer: ", "priority  newcomer: "]
