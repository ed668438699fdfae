"""Notebook views: a store's runs as an HTML table, a run's metrics as inline SVG (parsed)."""

from __future__ import annotations

import sys
from html.parser import HTMLParser

import pytest
import report_jobs

import afk_local as afk


class Tree(HTMLParser):
    """Start tags with their attributes, and the text, of an HTML fragment."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.open: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))  # <rect/>: opens nothing

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, (self.open, tag)  # well nested
        self.open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def named(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for name, attrs in self.tags if name == tag]


HOSTILE = "<script>alert(1)</script>"


@pytest.fixture
def store(afk_store: afk.Store) -> afk.Store:
    job = report_jobs.metered.with_store(afk_store)
    job.run(4, run_id="done", tags={"note": HOSTILE})
    report_jobs.FAIL_AT[:] = [1]
    with pytest.raises(ValueError):
        job.run(4, run_id="broken")

    @afk.durable(store=afk_store)
    def named(ctx: afk.RunContext) -> None:
        ctx.metric("<b>loss</b>", 1.0)
        ctx.metric("<b>loss</b>", 0.5)

    named.run(run_id="odd-names")
    return afk_store


def test_store_and_runs_render_as_a_table(store: afk.Store) -> None:
    tree = Tree(store._repr_html_())
    assert not tree.open
    assert [t for t, _ in tree.tags].count("table") == 1
    assert "script" not in [t for t, _ in tree.tags]  # a tag value is text, not markup
    assert HOSTILE in "".join(tree.text)
    rows = tree.named("tr")
    assert len(rows) == 1 + 3  # header + one per run
    bars = tree.named("progress")
    assert {bar["value"] for bar in bars} == {"100.0", "25.0"}  # done 4/4; broken at item 1 of 4
    colours = {attrs["style"] for attrs in tree.named("span")}
    assert any("#1a7f37" in (c or "") for c in colours) and any(
        "#cf222e" in (c or "") for c in colours
    )
    assert str(store.root) in "".join(tree.text)

    listing = store.runs(status="failed")
    assert [i.run_id for i in listing] == ["broken"]
    assert len(Tree(listing._repr_html_()).named("tr")) == 2
    assert Tree(store.info("done")._repr_html_()).named("progress")[0]["max"] == "100"


def test_run_view_draws_metrics_as_inline_svg(store: afk.Store) -> None:
    tree = Tree(store.open("done")._repr_html_())
    assert not tree.open
    svgs = tree.named("svg")
    assert len(svgs) == 2  # loss and item
    lines = tree.named("polyline")
    assert [len((line["points"] or "").split()) for line in lines] == [4, 4]
    assert any("loss: last 0.25" in t for t in tree.text)

    odd = Tree(store.open("odd-names")._repr_html_())
    assert "b" not in [t for t, _ in odd.tags] and "script" not in [t for t, _ in odd.tags]
    assert any("<b>loss</b>" in t for t in odd.text)

    broken = Tree(store.open("broken")._repr_html_())
    assert "item 1 broke" in "".join(broken.text)


def test_runs_and_metrics_as_records_and_dataframes(store: afk.Store) -> None:
    records = store.runs().to_records()
    assert {r["run_id"] for r in records} == {"done", "broken", "odd-names"}
    done = next(r for r in records if r["run_id"] == "done")
    assert (done["done"], done["total"], done["fraction"]) == (4, 4, 1.0)
    metrics = store.open("done").metrics()
    assert metrics.names() == ["loss", "item"]
    assert metrics.to_records()[0] == {
        "name": "loss",
        "value": 1.0,
        "step": 0,  # recorded in the first ctx.iterate item: its index
        "timestamp_ms": metrics[0].timestamp_ms,
        "seq": metrics[0].seq,
    }
    pandas = pytest.importorskip("pandas")
    frame = store.runs().to_pandas()
    assert isinstance(frame, pandas.DataFrame) and len(frame) == 3
    points = metrics.to_pandas()
    assert list(points.columns) == ["name", "value", "step", "timestamp_ms", "seq"]
    assert points[points["name"] == "item"]["value"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_without_pandas_to_pandas_says_so(
    store: afk.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="to_records"):
        store.runs().to_pandas()
    with pytest.raises(ImportError, match="pip install pandas"):
        store.open("done").metrics().to_pandas()


def test_a_loop_without_journaled_steps_shows_its_items_not_step_0(
    afk_store: afk.Store,
) -> None:
    """A ctx.iterate job that journals no call: its checkpoints say how many items were
    done, and the runs table shows no step (a checkpoint's step counts journaled calls)."""

    @afk.durable(store=afk_store)
    def loop(ctx: afk.RunContext, n: int) -> int:
        ctx.state.setdefault("total", 0)
        for i in ctx.iterate(range(n)):
            ctx.state["total"] += i
        return int(ctx.state["total"])

    assert loop.run(3, run_id="loop") == 3
    checkpoints = Tree(afk_store.open("loop")._repr_html_())
    text = checkpoints.text
    assert "where" in text
    assert [t for t in text if t.endswith("items done")] == [
        "1 of 3 items done",
        "2 of 3 items done",
        "3 of 3 items done",
        "3 of 3 items done",  # the terminal checkpoint
    ]
    assert not any("step 0" in t for t in text)

    runs = Tree(afk_store._repr_html_()).text
    headers = runs[runs.index("run") : runs.index("tags") + 1]
    row = runs[runs.index("loop") :]
    assert row[headers.index("step")] == "-"  # no journaled call: no step to show
    assert row[headers.index("attempts")] == "1"
