"""The CPDAE decoder's top words for sample texts (Markdown, and HTML for the report)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .. import artifacts
from ..markdown_html import markdown_to_html
from ..model_folder import check_folder_vocabulary, check_safetensors, load_model
from ..tokenizer_files import auto_tokenizer
from .common import encoder_weights, excluded_ids, load_heads, write_manifest


def cpdae_top_words(
    encoder_dir: Path, texts: Sequence[str], top: int, out_md: Path, out_html: Path | None = None
) -> str:
    import torch

    check_safetensors(encoder_dir)  # before any output: a pickled encoder is refused
    heads_path = Path(encoder_dir).parent / "heads.safetensors"
    heads = load_heads(heads_path)
    decoder_state = {
        k.removeprefix("decoder."): v for k, v in heads.items() if k.startswith("decoder.")
    }
    lines = [f"# CPDAE decoder: top {top} words", ""]
    if not decoder_state:
        lines.append(
            f"No decoder weights in `{heads_path}`: the pre-training export did not save the "
            "CPDAE heads, so the decoder's words cannot be shown."
        )
    else:
        from ..pretrain.model import cpdae_decoder

        tokenizer = auto_tokenizer(encoder_dir)
        check_folder_vocabulary(encoder_dir, tokenizer)  # an id past the embeddings fails them
        encoder = load_model(encoder_dir, add_pooling_layer=False).eval()
        decoder = cpdae_decoder(
            encoder.config.hidden_size, encoder.config.vocab_size, encoder.config.layer_norm_eps
        )
        decoder.load_state_dict(decoder_state, strict=True)
        decoder.eval()
        skip = excluded_ids(tokenizer)
        for text in texts:
            batch = tokenizer(text, return_tensors="pt", truncation=True, max_length=512)
            with torch.inference_mode():
                cls = encoder(**batch).last_hidden_state[:, 0]
                probs = torch.sigmoid(decoder(cls))[0].clone()
                probs[skip] = -1.0  # special and [unused] ids are never words
            values, ids = torch.topk(probs, top)
            inputs = set(batch["input_ids"][0].tolist())
            words = [
                f"{tokenizer.convert_ids_to_tokens(int(i))} "
                f"({v:.2f}{', in text' if int(i) in inputs else ''})"
                for v, i in zip(values.tolist(), ids.tolist())
            ]
            lines += [f"**Text:** {text}", "", "**Top words:** " + " · ".join(words), ""]
    text_out = "\n".join(lines) + "\n"
    with artifacts.atomic_path(out_md) as tmp:
        tmp.write_text(text_out)
    if out_html is not None:
        with artifacts.atomic_path(out_html) as tmp:
            tmp.write_text(markdown_to_html(text_out, "CPDAE decoder top words"))
    write_manifest(
        out_md,
        "analysis.cpdae_top_words",
        {"texts": list(texts), "top": top},
        {"encoder": encoder_weights(encoder_dir), "heads": heads_path},
        {"decoder_found": bool(decoder_state), "texts": len(texts)},
    )
    return text_out
